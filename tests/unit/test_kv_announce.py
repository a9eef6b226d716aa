"""The agent's prefix announcements (apps/agent/kvannounce.py): each waits, bounded, for what the
orchestrator needs to keep it, and a dropped one says why. Three ways a loaded machine lost an
announcement (the real-vLLM conformance run, two CPU burners: the engine's blocks were indexed but no
announcement came): the request's `done` came before the batch storing its blocks was read (the
orchestrator refused a block it had not seen), before the registration's `connected` ran, or the
engine's tokenizer answered after the probe's timeout."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from apps.agent import kvannounce
from apps.agent.engine import EngineClient
from apps.agent.kvforward import KvForwarder
from apps.core.protocol import node as proto
from apps.core.scheduling.prefix import block_keys, lookup_keys
from apps.orchestrator.prefix_index import PrefixIndex
from tests.fakes.web_server import serve_app
from tests.unit.test_kv_forward import BS, PROMPT, Sent, _stored, pub_endpoint, publisher, replay_endpoint

pytestmark = pytest.mark.timeout(30)
MESSAGES = [{"role": "user", "content": "hi"}]
ASSIGN = proto.Assign(request_id="r1", model="m", body={"model": "m", "messages": MESSAGES})


def _orchestrator_keeps(frames: list[proto._Frame]) -> list[bool]:
    """What the orchestrator's index does with each announcement, `frames` applied in order."""
    index, kept = PrefixIndex(), []
    for f in frames:
        if isinstance(f, proto.KvEvents):
            index.apply("n1", f)
        elif isinstance(f, proto.KvPrefix):
            kept.append(index.announce("n1", f))
    return kept


class Tokenizer:
    """The engine's tokenizer: the prompt's ids, and a wake-up once asked."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> list[int]:
        self.asked.set()
        return list(PROMPT)


async def test_the_announcement_goes_after_the_batch_that_stored_its_block(tmp_path: Path) -> None:
    """The request's `done` is here, its tokens counted, before the batch with its blocks was read:
    the announcement waits for that batch and goes after it on the socket. Made to fail by setting
    the wait to 0 (what the agent did before): the announcement went first and the index refused it."""
    sent, tokenizer = Sent(), Tokenizer()
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    forwarder.prefixes.token_ids = tokenizer
    with publisher(tmp_path) as pub:
        pub.publish([_stored(0, 1)])  # seq 0, an earlier request's block: the block size is known
        pub.flush()
        await forwarder.connected(sent)
        forwarder.prefixes.request_done(ASSIGN)
        await asyncio.wait_for(tokenizer.asked.wait(), 10)
        pub.publish([_stored(1, 2)])  # seq 1: the request's blocks, read only now
        pub.flush()
        await forwarder._live(*pub._buffer[-1])
        await asyncio.wait_for(forwarder.prefixes.settled(), 10)
    kinds = [type(f).__name__ for f in sent.frames]
    assert kinds == ["KvReset", "KvEvents", "KvEvents", "KvPrefix"], kinds
    assert _orchestrator_keeps(sent.frames) == [True]
    prefix = sent.frames[-1]
    assert isinstance(prefix, proto.KvPrefix)
    assert (prefix.key, prefix.blocks) == (lookup_keys(MESSAGES)[-1], len(PROMPT) // BS)
    assert prefix.block == block_keys(PROMPT, BS)[-1].hex()
    assert forwarder.prefixes.dropped == {}


async def test_a_request_that_ends_before_the_connection_is_announced_once_connected(tmp_path: Path) -> None:
    """The first request can end before the registration's `connected` ran (a node that reconnects
    with a stream still running, too): the announcement waits for the connection. Made to fail on the
    old code, which returned at once when there was no connection to send on."""
    sent, looked = Sent(), asyncio.Event()
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    forwarder.prefixes.token_ids = Tokenizer()

    def link() -> Any:
        looked.set()  # the announcement looked for a connection
        return forwarder.send

    forwarder.prefixes.link = link
    with publisher(tmp_path) as pub:
        pub.publish([_stored(0, 3)])  # seq 0: the request's blocks, published before anyone listened
        pub.flush()
        forwarder.prefixes.request_done(ASSIGN)
        await asyncio.wait_for(looked.wait(), 10)  # and found none
        await forwarder.connected(sent)  # replays seq 0
        await asyncio.wait_for(forwarder.prefixes.settled(), 10)
    assert [type(f).__name__ for f in sent.frames] == ["KvReset", "KvEvents", "KvPrefix"]
    assert _orchestrator_keeps(sent.frames) == [True]
    assert forwarder.prefixes.announced == 1


async def test_an_announcement_waits_for_the_block_size_the_first_stored_block_brings(tmp_path: Path) -> None:
    """The first request's `done` can come before any stored block was read (the real vLLM
    conformance run saw it, quiet machine): the announcement waits for the engine's block size."""
    sent = Sent()
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    tokenizer = Tokenizer()
    forwarder.prefixes.token_ids = tokenizer
    with publisher(tmp_path) as pub:
        await forwarder.connected(sent)  # nothing published yet
        forwarder.prefixes.request_done(ASSIGN)
        pub.publish([_stored(0, 3)])
        pub.flush()
        await forwarder._live(*pub._buffer[-1])
        await asyncio.wait_for(forwarder.prefixes.settled(), 10)
    assert tokenizer.asked.is_set()
    assert _orchestrator_keeps(sent.frames) == [True]


async def test_a_dropped_announcement_is_counted_and_logged_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kvannounce, "CONNECT_WAIT_S", 0.0)
    monkeypatch.setattr(kvannounce, "BLOCK_SIZE_WAIT_S", 0.0)
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    forwarder.prefixes.token_ids = Tokenizer()
    caplog.set_level(logging.INFO, "llmfleet.agent")
    forwarder.prefixes.request_done(ASSIGN)  # no connection, and none comes
    await asyncio.wait_for(forwarder.prefixes.settled(), 10)
    await forwarder.connected(Sent())
    forwarder.prefixes.request_done(ASSIGN)  # connected, but no block was ever stored
    await asyncio.wait_for(forwarder.prefixes.settled(), 10)
    assert forwarder.prefixes.dropped == {"not_connected": 1, "block_size_unknown": 1}
    reasons = [getattr(r, "reason", None) for r in caplog.records if r.msg == "kv_prefix_announce_dropped"]
    assert reasons == ["not_connected", "block_size_unknown"]
    assert all("hi" not in r.getMessage() for r in caplog.records)  # never the conversation


async def test_the_announcements_tokenizer_call_outlasts_a_probe() -> None:
    """A busy engine's `/tokenize` answered after the probe's timeout (3 s in the stacks) and the
    announcement was lost: its call has its own, longer limit; the probes keep theirs."""

    async def tokenize(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)  # the scripted engine is slower than the probe's 0.1 s: not a wait
        return web.json_response({"tokens": [1, 2, 3], "count": 3})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        engine = EngineClient(session, url, 0.1)
        body = {"model": "m", "messages": MESSAGES}
        assert await engine.prompt_tokens(body) is None  # a probe: gives up after 0.1 s
        assert await engine.token_ids(body) == [1, 2, 3]  # the announcement's call waits
