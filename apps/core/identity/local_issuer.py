"""A local JWT issuer for `llmfleet dev` and tests: an RSA key pair, its JWKS served on
loopback, and token minting, so dev exercises the same JWKS verification path as
production (no shared-secret shortcut).

The private key lives in a PEM file (mode 0600) in the data directory, so
`llmfleet admin mint-admin-token --issuer-key FILE` mints tokens the running dev
gateway accepts. The JWKS server is a stdlib `ThreadingHTTPServer` on 127.0.0.1 in a
daemon thread (the core package imports no web framework); `stop()` shuts it down.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

DEFAULT_ISSUER = "llmfleet-local"
DEFAULT_AUDIENCE = "llmfleet"


class LocalIssuer:
    def __init__(
        self,
        private_key: rsa.RSAPrivateKey,
        *,
        issuer: str = DEFAULT_ISSUER,
        audience: str = DEFAULT_AUDIENCE,
    ) -> None:
        self._key = private_key
        self.issuer = issuer
        self.audience = audience
        public = json.loads(RSAAlgorithm.to_jwk(private_key.public_key()))
        self.kid = uuid.uuid5(uuid.NAMESPACE_OID, public["n"]).hex[:16]
        public.update({"kid": self.kid, "alg": "RS256", "use": "sig"})
        self._jwk = public
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def generate(cls, **kwargs: Any) -> LocalIssuer:
        return cls(rsa.generate_private_key(public_exponent=65537, key_size=2048), **kwargs)

    @classmethod
    def load_or_create(cls, path: Path, **kwargs: Any) -> LocalIssuer:
        if path.exists():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            if not isinstance(key, rsa.RSAPrivateKey):
                raise ValueError(f"{path}: not an RSA private key")
            return cls(key, **kwargs)
        issuer = cls.generate(**kwargs)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(
                issuer._key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return issuer

    def jwks(self) -> dict[str, Any]:
        return {"keys": [self._jwk]}

    def mint(
        self,
        subject: str,
        *,
        team: str | None = None,
        admin: bool = False,
        ttl_s: int = 3600,
        extra: dict[str, Any] | None = None,
    ) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": subject,
            "iat": now,
            "exp": now + ttl_s,
        }
        if team is not None:
            claims["team"] = team
        if admin:
            claims["roles"] = ["admin"]
        claims.update(extra or {})
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"kid": self.kid})

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve `GET /.well-known/jwks.json`; returns the JWKS URL."""
        body = json.dumps(self.jwks()).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/.well-known/jwks.json", "/jwks.json"):
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log on stderr
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        # `shutdown` waits for the serving loop's next poll: at the default 0.5 s every gateway a
        # test suite starts and stops spent half a second in `stop` (about 2 minutes of the unit stage).
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="jwks", daemon=True
        )
        self._thread.start()
        bound_port = self._server.server_address[1]
        return f"http://{host}:{bound_port}/.well-known/jwks.json"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
