"""A tiny TCP proxy for cutting one agent's WebSocket without killing any process.

Runs its own event loop in a daemon thread so synchronous tests can drive it. `cut()`
closes every live connection and refuses new ones (accept-then-close, which the agent
sees as a failed dial) until `restore()`; every accepted connection's time is recorded so
a test can see the agent's backoff. `drop_downstream` keeps forwarding agent -> server
bytes but swallows server -> agent bytes (acknowledgements never arrive). `blackhole()` is a
silent partition: bytes in both directions are swallowed and no close is passed on either way (no
FIN, no RST), as when a NAT or a link drops everything, so each side learns only from its own
heartbeat timeout. `silent` is that state as a switch (`blackhole()` sets it; a test may clear it).
`fallback_ports`: a Service in front of replicas: a connection goes to the first port that accepts
it (the target while it lives, then the next), as kube-proxy stops sending to a dead endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import Future


class TcpProxy:
    def __init__(self, target_port: int, fallback_ports: tuple[int, ...] = ()) -> None:
        self.target_port = target_port
        self.fallback_ports = fallback_ports
        self.upstreams: list[int] = []  # the port each forwarded connection went to
        self.port = 0
        self.accepts: list[float] = []  # monotonic time of every accepted client connection
        self.refused: list[float] = []  # ... of those refused while cut
        self._cut = False
        self.drop_downstream = False
        self.silent = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> int:
        self._thread.start()
        self._call(self._start()).result(10)
        return self.port

    def _call(self, coro: object) -> Future[object]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, down: bool) -> None:
        try:
            while data := await reader.read(65536):
                if self.silent or (down and self.drop_downstream):
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not self.silent:  # a silent partition passes no close on
                writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        now = time.monotonic()
        self.accepts.append(now)
        if self._cut:
            self.refused.append(now)
            writer.close()
            return
        for port in (self.target_port, *self.fallback_ports):
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            self.upstreams.append(port)
            break
        else:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pipe(reader, up_writer, down=False))
                tg.create_task(self._pipe(up_reader, writer, down=True))
        finally:
            self._writers -= {writer, up_writer}

    async def _cut_all(self) -> None:
        self._cut = True
        for w in list(self._writers):
            w.transport.abort()  # an abrupt cut: RST, not a polite close

    def cut(self) -> None:
        self._call(self._cut_all()).result(10)

    def blackhole(self) -> None:
        """From now on forward nothing and close nothing (the connections stay open)."""
        self.silent = True

    def restore(self) -> None:
        self._cut = False

    @property
    def live_connections(self) -> int:
        return len(self._writers) // 2

    def close(self) -> None:
        async def _close() -> None:
            await self._cut_all()
            if self._server is not None:
                self._server.close()
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._call(_close()).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
