"""`wss://` with a configurable CA bundle: the agent trusts exactly the CA it is given."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from apps.agent.deps import AgentDeps
from apps.agent.telemetry import NoGpuProbe
from tests.fakes.fake_orchestrator import FakeOrchestrator, running_agent


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(tmp: Path, cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    path = tmp / f"{cn}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


def _server_context(tmp: Path, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("orchestrator"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "server.pem", tmp / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


class CountingClock:
    def __init__(self) -> None:
        self.sleeps: list[float] = []
        self.slept = asyncio.Event()

    def monotonic(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.slept.set()
        await asyncio.sleep(0.01)


async def test_wss_with_the_right_ca_bundle_registers(tmp_path: Path) -> None:
    ca_key, ca, ca_path = _ca(tmp_path, "llmfleet-test-ca")
    orch = FakeOrchestrator(ssl_context=_server_context(tmp_path, ca_key, ca))
    async with running_agent(tmp_path, orch=orch, ca_bundle=ca_path) as run:
        assert run.orch.url.startswith("wss://")
        assert run.agent.ready()
        assert orch.registrations[0].node_id == "node-1"


async def test_wss_with_another_ca_is_refused_and_retried(tmp_path: Path) -> None:
    ca_key, ca, _ = _ca(tmp_path, "llmfleet-test-ca")
    _, _, other_path = _ca(tmp_path, "someone-else")
    orch = FakeOrchestrator(ssl_context=_server_context(tmp_path, ca_key, ca))
    clock = CountingClock()
    deps = AgentDeps(clock=clock, gpu_probe=NoGpuProbe())
    async with running_agent(
        tmp_path, orch=orch, deps=deps, ca_bundle=other_path, wait_registered=False
    ) as run:
        async with asyncio.timeout(10):
            while len(clock.sleeps) < 2:  # two failed handshakes, each followed by a backoff
                clock.slept.clear()
                await clock.slept.wait()
        assert orch.connections == 0  # the token never went to an unverified server
        assert not run.agent.ready()
        registry = run.agent.metrics.registry
        assert (
            registry.get_sample_value("llmfleet_agent_connect_attempts_total", {"result": "failed"}) or 0
        ) >= 2


async def test_the_raw_upstream_client_speaks_https_and_checks_the_certificate(tmp_path: Path) -> None:
    """An https engine URL: the agent's stream client (`apps.netio.http_client`) verifies the
    server against the CA it is given, and refuses an unverified one before sending anything."""
    from aiohttp import web

    from apps.netio.http_client import HostPool, Unreachable

    ca_key, ca, ca_path = _ca(tmp_path, "llmfleet-test-ca")
    seen: list[bytes] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.Response(text="data: ok\n\n")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=_server_context(tmp_path, ca_key, ca))
    await site.start()
    port = runner.addresses[0][1]
    trusted = HostPool(
        f"https://127.0.0.1:{port}", ssl_context=ssl.create_default_context(cafile=str(ca_path))
    )
    _, _, other = _ca(tmp_path, "someone-else")
    untrusted = HostPool(
        f"https://127.0.0.1:{port}", ssl_context=ssl.create_default_context(cafile=str(other))
    )
    try:
        async with asyncio.timeout(10):
            resp = await trusted.request("POST", "/v1/chat/completions", {}, b'{"x":1}')
            assert resp.status == 200
            assert await resp.read_body() == b"data: ok\n\n"
            with pytest.raises(Unreachable):
                await untrusted.request("POST", "/v1/chat/completions", {}, b'{"x":2}')
        assert seen == [b'{"x":1}']  # nothing went to the unverified server
    finally:
        await trusted.aclose()
        await untrusted.aclose()
        await runner.cleanup()
