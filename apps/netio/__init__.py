"""The network layer: everything that touches a framework's transport or speaks a raw protocol.

Between the apps and `apps.core` (import-linter contract): the platform's HTTP/1.1 client
(`http_client`), and the fast paths that write on uvicorn's and aiohttp's transports
(`uvicorn_writer`, `aiohttp_server`), each behind a capability probe, a fallback to
the framework's public API, a switch and a metric (`fastpath`). README.md here has the design.
"""
