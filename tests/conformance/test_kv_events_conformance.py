"""KV cache events and prefix caching agree, on enginesim and on the real vLLM 0.32.

Each engine runs with `--kv-events-config` publishing on an `ipc://` socket (and a replay ROUTER
socket), read by `kvevents.py`. The block size is the engine's own, read from its events (128 on
vLLM's CPU backend, 16 in enginesim's tiny profile), never assumed.

- A conversation sent twice (a long unique prompt with a long answer, then the same prompt, that
  answer and a second turn): the first request's blocks, prompt and answer, are stored once as one
  chain (parent None, then each block's parent the one before) holding the prompt's token ids; the
  second request's `cached_tokens` is the full blocks it shares with that chain (as far as its
  prompt's token ids agree with the chain's, short of its last token) times the block size, those
  blocks are not stored again, its own blocks continue the chain from the last shared one, and
  `vllm:prefix_cache_queries` / `_hits` move by its prompt tokens / its cached tokens.
- Filling the cache evicts: `BlockRemoved` names hashes stored before, an evicted request's among them.
- The replay socket answers vLLM's protocol, from sequence number 0 with no gaps, and every batch
  has the same wire shape on both engines (`WIRE`).
- A pause that clears the cache says `AllBlocksCleared`, and the blocks are stored again after it.
- The agent forwards the events over its WebSocket (protocol version 5) and the orchestrator's prefix
  index then holds every full block of a prompt the engine ran, keyed by its tokens
  (`apps/orchestrator/prefix_index.py`); a new connection clears the node's index and the engine's
  replay buffer rebuilds it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.core.ledger.teams import TeamStore
from apps.core.scheduling.prefix import block_keys, lookup_keys, team_scope
from apps.orchestrator.app import PLANE
from tests.conformance.agent_env import NODE_ID, PRICES, agent_fleet, cost
from tests.conformance.conftest import VLLM_CAP_S, EngineUnderTest, serve_enginesim, serve_vllm
from tests.conformance.helpers import metric, metric_values, poll_until
from tests.conformance.kvevents import (
    PREFIX,
    KvEventLog,
    StoredBlock,
    chain_in,
    prompt_ids,
    prompt_of,
    replay,
    stored_after,
    wait_live,
)
from tests.conformance.slots import run_tag, words
from tests.integration.orchestrator_env import poll

KV_TOKENS = 2048  # the cache both engines get: a few long prompts overflow it
MAX_MODEL_LEN = 2048
ENGINESIM_BLOCK = 16  # enginesim's tiny profile: only to size its --num-blocks
VLLM_CPU_BLOCK = 128  # vLLM 0.32's CPU backend: only to size its KV cache bytes
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4  # the tiny Llama (tools/build_tiny_llama.py), float32
FIRST_PROMPT, ANSWER = 600, 300  # tokens: the answer fills blocks of its own on both engines
FILLER_PROMPT, FILLERS = 1500, 3  # three of them overflow the cache
METRICS_DEADLINE_S = 30.0
# The keys of each event type and of a batch, as vLLM 0.32 sends them (msgspec, defaults omitted).
WIRE = {
    "BlockStored": frozenset(
        {
            "type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
            "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
        }
    ),
    "BlockRemoved": frozenset({"type", "block_hashes", "medium", "group_idx"}),
    "AllBlocksCleared": frozenset({"type"}),
}  # fmt: skip


def _events_config(work: Path) -> tuple[str, str, str]:
    endpoint, replay_endpoint = f"ipc://{work}/kv-events.sock", f"ipc://{work}/kv-replay.sock"
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay_endpoint,
        "topic": "kv",
    }
    return json.dumps(config), endpoint, replay_endpoint


class KvEngine:
    def __init__(self, engine: EngineUnderTest, log: KvEventLog, replay_endpoint: str) -> None:
        self.engine, self.log, self.replay_endpoint = engine, log, replay_endpoint


@pytest.fixture(scope="module")
def kv_enginesim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KvEngine]:
    work = tmp_path_factory.mktemp("enginesim-kv-events")
    config, endpoint, replay_endpoint = _events_config(work)
    log = KvEventLog(endpoint)
    log.start()
    try:
        for engine in serve_enginesim(
            work, "--num-blocks", str(KV_TOKENS // ENGINESIM_BLOCK + 1), "--kv-events-config", config
        ):
            wait_live(engine, log, "live", replay_endpoint)
            yield KvEngine(engine, log, replay_endpoint)
    finally:
        log.stop()


@pytest.fixture(scope="module")
def kv_vllm(tiny_llama: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[KvEngine]:
    python, model_dir = tiny_llama
    work = tmp_path_factory.mktemp("vllm-kv-events")
    config, endpoint, replay_endpoint = _events_config(work)
    log = KvEventLog(endpoint)
    log.start()
    try:
        for engine in serve_vllm(
            python, model_dir, work,
            str((KV_TOKENS + VLLM_CPU_BLOCK) * TINY_KV_BYTES_PER_TOKEN),
            extra=("--kv-events-config", config, "--max-num-batched-tokens", str(MAX_MODEL_LEN)),
        ):  # fmt: skip
            wait_live(engine, log, "live", replay_endpoint)
            yield KvEngine(engine, log, replay_endpoint)
    finally:
        log.stop()


@pytest.fixture(
    params=[
        "enginesim",
        pytest.param("vllm", marks=[pytest.mark.realvllm, pytest.mark.timeout(VLLM_CAP_S + 300)]),
    ]
)
def kv(request: pytest.FixtureRequest) -> KvEngine:
    engine: KvEngine = request.getfixturevalue(f"kv_{request.param}")
    return engine


async def _chat(engine: EngineUnderTest, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body = {
        "model": engine.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    async with httpx.AsyncClient(timeout=120.0) as client:
        resp = await client.post(f"{engine.url}/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _cached(response: dict[str, Any]) -> int:
    return int(response["usage"]["prompt_tokens_details"]["cached_tokens"])


def _prefix_counters(engine: EngineUnderTest) -> tuple[float, float]:
    with httpx.Client(timeout=30.0) as client:
        values = metric_values(client, engine.url)
    return metric(values, "vllm:prefix_cache_queries_total"), metric(values, "vllm:prefix_cache_hits_total")


def _tokens(blocks: list[StoredBlock]) -> list[int]:
    return [t for b in blocks for t in b.tokens]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _without(blocks: list[StoredBlock], other: list[StoredBlock]) -> list[StoredBlock]:
    hashes = {b.block_hash for b in other}
    return [b for b in blocks if b.block_hash not in hashes]


async def _segment_end(kv: KvEngine, tag: str) -> tuple[int, list[StoredBlock]]:
    """Wait until everything sent so far has its events; returns the log's length and the blocks of
    the marker request (not the checked requests')."""
    await stored_after(kv.engine, kv.log, tag)
    marker = tuple((await prompt_ids(kv.engine, _marker_text(tag)))[:PREFIX])
    return len(kv.log.stored), chain_in(kv.log.stored, marker)


def _marker_text(tag: str) -> str:
    return words(tag, 40)  # the text `stored_after` sends


async def test_a_second_turn_hits_the_blocks_the_first_stored_once(kv: KvEngine) -> None:
    engine, log, tag = kv.engine, kv.log, run_tag()
    mark0, _ = await _segment_end(kv, f"w{tag}x")  # the subscription is live
    first_turn = [{"role": "user", "content": await prompt_of(engine, f"a{tag}x", FIRST_PROMPT)}]
    ids1 = await prompt_ids(engine, first_turn)
    r1 = await _chat(engine, first_turn, ANSWER)
    answer_tokens = int(r1["usage"]["completion_tokens"])
    assert (int(r1["usage"]["prompt_tokens"]), answer_tokens) == (len(ids1), ANSWER), r1["usage"]
    mark1, marker1 = await _segment_end(kv, f"m{tag}x")
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
        {"role": "user", "content": f"and then {tag}?"},
    ]
    ids2 = await prompt_ids(engine, second_turn)
    before = _prefix_counters(engine)
    r2 = await _chat(engine, second_turn, 1)

    def counted() -> tuple[float, float] | None:  # vLLM's counters may lag the response a little
        now = _prefix_counters(engine)
        return now if now[0] - before[0] >= len(ids2) else None

    moved = await asyncio.to_thread(poll_until, counted, METRICS_DEADLINE_S)
    mark2, marker2 = await _segment_end(kv, f"z{tag}x")
    assert log.gaps == 0, f"the log lost messages: {log.summary()}"
    bs = log.block_size
    assert bs > 0, log.summary()

    # The first request: one chain, prompt and answer blocks, holding the prompt's token ids.
    first = chain_in(log.stored[mark0:mark1], tuple(ids1[:PREFIX]))
    assert len(first) == (len(ids1) + answer_tokens - 1) // bs, (len(first), len(ids1), answer_tokens, bs)
    assert len(first) * bs > len(ids1), "no block of the answer was stored"
    assert _tokens(first)[: len(ids1)] == ids1
    assert _without(log.stored[mark0:mark1], marker1) == first, "blocks stored outside the chain"

    # The second request: its cached tokens are the full blocks it shares with that chain.
    shared = min(_common_prefix(ids2, _tokens(first)), len(ids2) - 1) // bs
    assert shared >= len(ids1) // bs, (shared, len(ids1), bs)
    assert (int(r2["usage"]["prompt_tokens"]), _cached(r2)) == (len(ids2), shared * bs), r2["usage"]
    second = _without(log.stored[mark1:mark2], marker2)
    assert log.stored_twice(b.block_hash for b in first) == 0, "a shared block was stored again"
    assert len(second) == len(ids2) // bs - shared, (len(second), len(ids2), shared, bs)
    if second:
        assert second[0].parent == first[shared - 1].block_hash, "the chain does not continue"
        assert all(b.parent == a.block_hash for a, b in itertools.pairwise(second))
        assert _tokens(second) == ids2[shared * bs : (shared + len(second)) * bs]

    # The prefix-cache counters: the second request's tokens looked up, and found.
    assert (moved[0] - before[0], moved[1] - before[1]) == (len(ids2), shared * bs), (before, moved)


async def test_filling_the_cache_removes_blocks_that_were_stored(kv: KvEngine) -> None:
    engine, log, tag = kv.engine, kv.log, run_tag()
    await stored_after(engine, log, f"w{tag}x")
    text = await prompt_of(engine, f"e{tag}x", FIRST_PROMPT)
    ids = await prompt_ids(engine, text)
    await _chat(engine, [{"role": "user", "content": text}], 1)
    await stored_after(engine, log, f"m{tag}x")
    evicted = {b.block_hash for b in chain_in(log.stored, tuple(ids[:PREFIX]))}
    assert len(evicted) == len(ids) // log.block_size, (len(evicted), len(ids), log.block_size)
    for i in range(FILLERS):
        filler = await prompt_of(engine, f"f{i}{tag}x", FILLER_PROMPT)
        await _chat(engine, [{"role": "user", "content": filler}], 1)
    await stored_after(engine, log, f"z{tag}x")
    removed = set(log.removed)
    assert evicted <= removed, f"{len(evicted - removed)} of the request's {len(evicted)} blocks not removed"
    assert removed <= {b.block_hash for b in log.stored}, "a removed hash was never stored"
    assert log.gaps == 0, log.summary()


async def test_the_wire_format_and_the_replay_socket(kv: KvEngine) -> None:
    engine, log, tag = kv.engine, kv.log, run_tag()
    await stored_after(engine, log, f"w{tag}x")
    batches = await asyncio.to_thread(replay, kv.replay_endpoint, 0, 30.0)
    seqs = [seq for _, seq, _ in batches]
    assert seqs == list(range(len(seqs))), (seqs[:3], seqs[-3:])
    assert seqs[-1] >= log.last_seq, (seqs[-1], log.last_seq)
    assert {topic for topic, _, _ in batches} == log.topics == {b"kv"}
    assert {(len(b), b[2]) for _, _, b in batches} == log.batch_shapes == {(3, 0)}
    assert all(isinstance(b[0], float) and b[1] for _, _, b in batches)
    replayed = {(e["type"], tuple(sorted(e))) for _, _, b in batches for e in b[1]}
    assert all(set(keys) == WIRE[kind] for kind, keys in replayed), replayed
    values = {
        (e["medium"], e["group_idx"], e.get("kv_cache_spec_kind"), e.get("lora_id"), e.get("lora_name"))
        for _, _, b in batches
        for e in b[1]
        if e["type"] != "AllBlocksCleared"
    }
    assert values <= {("GPU", 0, "full_attention", None, None), ("GPU", 0, None, None, None)}, values
    assert all(
        e["extra_keys"] == [None] * len(e["block_hashes"])
        for _, _, b in batches
        for e in b[1]
        if e["type"] == "BlockStored"
    )
    assert "BlockStored" in log.shapes, log.shapes
    assert all(shapes == {WIRE[kind]} for kind, shapes in log.shapes.items()), log.shapes
    later = await asyncio.to_thread(replay, kv.replay_endpoint, seqs[-1], 30.0)
    assert [seq for _, seq, _ in later] == [seqs[-1]]


async def test_a_pause_that_clears_the_cache_says_all_blocks_cleared(kv: KvEngine) -> None:
    engine, log, tag = kv.engine, kv.log, run_tag()
    await stored_after(engine, log, f"w{tag}x")
    text = await prompt_of(engine, f"c{tag}x", FIRST_PROMPT)
    ids = await prompt_ids(engine, text)
    await _chat(engine, [{"role": "user", "content": text}], 1)
    cleared = log.cleared
    async with httpx.AsyncClient(timeout=60.0) as client:
        resp = await client.post(f"{engine.url}/pause", params={"mode": "keep", "clear_cache": "true"})
        assert resp.status_code == 200, resp.text
        resp = await client.post(f"{engine.url}/resume")
        assert resp.status_code == 200, resp.text
    again = await _chat(engine, [{"role": "user", "content": text}], 1)
    await stored_after(engine, log, f"z{tag}x")
    assert log.cleared == cleared + 1, log.summary()
    assert _cached(again) == 0, again["usage"]
    blocks = {b.block_hash for b in chain_in(log.stored, tuple(ids[:PREFIX]))}
    assert log.stored_twice(blocks) == len(ids) // log.block_size, "the blocks were not stored again"


async def test_the_agent_forwards_the_events_and_the_orchestrator_indexes_the_prompt(
    kv: KvEngine, migrated_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    engine, log, tag = kv.engine, kv.log, run_tag()
    endpoints = {"kv_events_endpoint": log.endpoint, "kv_events_replay_endpoint": kv.replay_endpoint}
    async with agent_fleet(engine, migrated_db_url, redis_url, tmp_path, **endpoints) as fleet:
        prefixes = fleet.orch.app[PLANE].prefixes
        messages = [{"role": "user", "content": await prompt_of(engine, f"f{tag}x", FIRST_PROMPT)}]
        ids = await prompt_ids(engine, messages)
        request_id = await fleet.reserve(4)
        body = {"model": engine.model, "messages": messages, "max_tokens": 4, "stream": True}
        assert (await fleet.dispatch(request_id, body, wants_usage=False)).status == 200
        await stored_after(engine, log, f"g{tag}x")  # the engine published the request's blocks
        bs = log.block_size
        salt = [team_scope(fleet.team_id)]  # the engine's `cache_salt`, in its first block's hash
        keys = block_keys(ids, bs, salt)
        assert len(keys) == len(ids) // bs > 0

        def indexed() -> Any:
            return _matched(prefixes, engine.model, keys)

        # The agent's forwarding runs beside the request: its frames come a little after the engine's.
        assert await poll(indexed, lambda n: n == len(keys)) == len(keys)
        # The agent announced the conversation's prefix (its engine's tokenizer counting the blocks):
        # every replica's picker now finds the node holding it.
        store = fleet.orch.app[PLANE].prefix_store
        forwarder = fleet.agent.kv
        assert forwarder is not None
        try:  # each of the announcement's waits is bounded (apps/agent/kvannounce.py): 35 s in all
            announced = await poll(
                lambda: store.matches(engine.model, lookup_keys(messages, scope=salt[0])),
                lambda m: NODE_ID in m,
                deadline_s=60,
            )
        except AssertionError as exc:
            announcer = forwarder.prefixes
            raise AssertionError(
                f"{exc}; agent: {announcer.announced} sent, dropped {dict(announcer.dropped)}"
            ) from exc
        assert 0 < announced[NODE_ID] <= len(keys)
        assert await store.matches(engine.model, lookup_keys(messages)) == {}  # not another team's prefix
        assert (
            prefixes.matched(NODE_ID, engine.model, block_keys(ids, bs)) == 0
        )  # the salt reached the engine
        engine_blocks = prefixes.engine(NODE_ID, engine.model)
        assert engine_blocks is not None
        assert engine_blocks.unkeyed == 0  # every stored block's parent was seen: nothing left out
        assert prefixes.matched(NODE_ID, engine.model, block_keys([ids[0] + 1, *ids[1:]], bs, salt)) == 0

        # A new connection: the orchestrator forgets the node's index (`kv_reset connected`), the
        # engine's replay buffer rebuilds it from sequence 0.
        resets, forwarded = forwarder.resets, forwarder.forwarded
        registered = fleet.agent.registered
        registered.clear()
        fleet.orch.app[PLANE].routing.local[NODE_ID].close(4000, "test: reconnect")
        await asyncio.wait_for(registered.wait(), 30)
        assert await poll(indexed, lambda n: n == len(keys)) == len(keys)
        assert forwarder.resets == resets + 1
        # The whole history again, from sequence 0 up to what the log had seen by the close (the
        # engine's buffer keeps 10,000 batches: all of this module's).
        assert forwarder.forwarded - forwarded >= log.last_seq + 1


async def _matched(prefixes: Any, model: str, keys: list[bytes]) -> int:
    return int(prefixes.matched(NODE_ID, model, keys))


async def test_a_second_turn_is_billed_its_cached_tokens_at_the_cached_price(
    kv: KvEngine, migrated_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The engine reports the prompt tokens it found in its prefix cache
    (`usage.prompt_tokens_details.cached_tokens`); the agent carries them in its `done` and the
    ledger bills them at the cached-input price: the bill is exact to that report."""
    engine, tag = kv.engine, run_tag()
    async with agent_fleet(engine, migrated_db_url, redis_url, tmp_path) as fleet:
        first_turn = [{"role": "user", "content": await prompt_of(engine, f"b{tag}x", FIRST_PROMPT)}]
        body = {"model": engine.model, "messages": first_turn, "max_tokens": 8, "stream": True}
        rid1 = await fleet.reserve(8)
        one = await fleet.dispatch(rid1, body, wants_usage=False)
        assert one.status == 200
        answer = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in one.chunks if c.get("choices")
        )
        await fleet.final_row(rid1)
        second = [*first_turn, {"role": "assistant", "content": answer}, {"role": "user", "content": "and?"}]
        rid2 = await fleet.reserve(8, prompt_tokens=MAX_MODEL_LEN)  # the cost is not capped by the estimate
        two = await fleet.dispatch(rid2, {**body, "messages": second}, wants_usage=True)
        assert two.status == 200
        usage = next(c["usage"] for c in reversed(two.chunks) if c.get("usage"))
        prompt, completion = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        cached = int(usage["prompt_tokens_details"]["cached_tokens"])
        assert 0 < cached <= prompt, usage  # the first turn's blocks were in the cache
        row = await fleet.final_row(rid2)
        cached_price = PRICES.cached_prompt
        expected = -(
            -(
                (prompt - cached) * PRICES.prompt_per_million_microcredits
                + cached * cached_price
                + completion * PRICES.completion_per_million_microcredits
            )
            // 1_000_000
        )
        assert (row.prompt_tokens, row.completion_tokens) == (prompt, completion)
        assert row.cost_microcredits == expected, (row, usage)
        uncached = cost(prompt, completion)
        assert row.cost_microcredits < uncached  # cheaper than the same tokens uncached

        # Another team sending the same conversation finds nothing of it cached (the engine's
        # `cache_salt` is the team's): it cannot learn from `cached_tokens` what the first team sent.
        teams = TeamStore(fleet.pool)
        other = await teams.create_team(f"other-{tag}")
        await teams.add_credits(other.id, 10**12)
        fleet.team_id = other.id
        rid3 = await fleet.reserve(8, prompt_tokens=MAX_MODEL_LEN)
        three = await fleet.dispatch(rid3, {**body, "messages": second}, wants_usage=True)
        assert three.status == 200
        usage3 = next(c["usage"] for c in reversed(three.chunks) if c.get("usage"))
        assert int(usage3["prompt_tokens"]) == prompt
        assert int((usage3.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) == 0, usage3
