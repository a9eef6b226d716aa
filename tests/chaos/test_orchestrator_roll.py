"""Chaos (issue 15 section 1): a rolling restart of every orchestrator replica, one at a time
(`llmfleet dev roll orchestrators`' logic, `apps/cli/roll.py`), while 200 client streams run
through the whole platform all along (each client starts its next stream when one ends).

With the socket handover (protocol version 3, `apps/orchestrator/handover.py`) no stream breaks:
every stream ends with `[DONE]` and no error event, and its text is exactly the text the same
request gets on a quiet platform (enginesim is deterministic: seed, prompt; so a lost or repeated
chunk shows), and every request is billed exactly once (one settled ledger row each, with all its
tokens; nothing left reserved; the team's balance matches its ledger).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest

from apps.cli import roll
from apps.cli.platform import MODEL_8B, LocalPlatform
from tests.chaos.conftest import PlatformFactory, eight_b_nodes
from tests.chaos.helpers import balance_consistent, engines_running, ledger_totals, settled_rows, wait_until

pytestmark = pytest.mark.chaos

CLIENTS = 200
PROMPTS = 8  # distinct prompts: each has one reference text
RUNNING = 100  # each replica is rolled while at least this many streams run on the engines


def _tokens(prompt: int) -> int:
    """Answers of different lengths (about 2 to 4 s at speed 0.25), so the clients do not move in
    lockstep."""
    return 20 + 4 * prompt


def _body(prompt: int) -> dict[str, object]:
    return {
        "model": MODEL_8B,
        "messages": [{"role": "user", "content": f"tell me story number {prompt}"}],
        "max_tokens": _tokens(prompt),
        "stream": True,
        "ignore_eos": True,
    }


@dataclass
class Result:
    prompt: int
    status: int
    text: str = ""
    done: bool = False
    errors: list[str] = field(default_factory=list)


async def _stream(client: httpx.AsyncClient, key: str, prompt: int) -> Result:
    headers = {"Authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/chat/completions", json=_body(prompt), headers=headers) as resp:
        result = Result(prompt, resp.status_code)
        if resp.status_code != 200:
            result.errors.append((await resp.aread()).decode()[:300])
            return result
        parts: list[str] = []
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                result.done = True
                continue
            event = json.loads(payload)
            if "error" in event:
                result.errors.append(payload[:300])
                continue
            for choice in event.get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
        result.text = "".join(parts)
    return result


async def _load(
    platform: LocalPlatform, stop: threading.Event, started: threading.Event, results: list[Result]
) -> None:
    assert platform.credentials is not None
    key = platform.credentials.api_key
    limits = httpx.Limits(max_connections=CLIENTS + 10, max_keepalive_connections=CLIENTS + 10)
    async with httpx.AsyncClient(base_url=platform.gateway_url, limits=limits, timeout=120) as client:

        async def one_client(i: int) -> None:
            n = 0
            while True:
                prompt = (i + n) % PROMPTS
                try:
                    results.append(await _stream(client, key, prompt))
                except httpx.HTTPError as exc:  # a broken stream, said with when: the load goes on
                    when = time.strftime("%H:%M:%S", time.gmtime())
                    results.append(Result(prompt, 0, errors=[f"{when} {type(exc).__name__}: {exc!r}"]))
                n += 1
                if len(results) >= CLIENTS:
                    started.set()
                if stop.is_set():
                    return

        await asyncio.gather(*(one_client(i) for i in range(CLIENTS)))


def _running(platform: LocalPlatform) -> int:
    """Streams running on the engines now (enginesim's `vllm:num_requests_running`)."""
    return int(engines_running(platform))


def _wait_running(platform: LocalPlatform, results: list[Result]) -> None:
    try:
        wait_until(lambda: _running(platform) >= RUNNING, 60, f"{RUNNING} streams running")
    except AssertionError:
        broken = [r for r in results if r.status != 200 or not r.done or r.errors]
        print(f"running {_running(platform)}; {len(results)} streams, {len(broken)} broken: {broken[-3:]}")
        raise


def _events(platform: LocalPlatform, name: str) -> list[dict[str, object]]:
    """The orchestrators' log events called `name` (JSON lines, one file per replica, appended
    across restarts)."""
    found: list[dict[str, object]] = []
    for path in sorted(platform.supervisor.log_dir.glob("orchestrator-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if f'"event": "{name}"' in line:
                found.append(json.loads(line))
    return found


@pytest.mark.timeout(300)  # the platform, the load and two rolls: about 2 minutes on 2 cores
def test_rolling_every_orchestrator_breaks_no_stream_and_bills_each_once(
    make_platform: PlatformFactory, migrated_db_url: str
) -> None:
    platform = make_platform(
        nodes=eight_b_nodes(4),
        # Simulated time at a quarter of real time (not the suite's 20x): a stream of a few dozen
        # tokens lasts seconds on its node, as real ones do, so every replica is rolled while many
        # run, and 200 of them ask ~2,400 tokens/s of the platform, which 2 shared cores carry (at
        # 20x they spend most of their time outside the nodes; at 2x the cores saturate and the
        # agents' heartbeats starve).
        speed=0.25,
        orchestrator_env={"LLMFLEET_HANDOVER_DEADLINE_S": "15", "LLMFLEET_SHUTDOWN_GRACE_S": "3"},
    )
    assert platform.credentials is not None

    # The reference text of each prompt, on the quiet platform.
    async def references() -> list[Result]:
        async with httpx.AsyncClient(base_url=platform.gateway_url, timeout=60) as client:
            key = platform.credentials.api_key  # type: ignore[union-attr]
            return await asyncio.gather(*(_stream(client, key, p) for p in range(PROMPTS)))

    reference = {r.prompt: r.text for r in asyncio.run(references())}
    assert all(len(text) > _tokens(p) for p, text in reference.items())

    stop, started = threading.Event(), threading.Event()
    results: list[Result] = []
    failure: list[BaseException] = []

    def run_load() -> None:
        try:
            asyncio.run(_load(platform, stop, started, results))
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    loader = threading.Thread(target=run_load, daemon=True)
    loader.start()
    try:
        assert started.wait(120), "the load did not get going"
        _wait_running(platform, results)
        rolled: list[str] = []
        t0 = time.monotonic()
        for step in roll.roll(platform, "orchestrators"):
            rolled.append(step)
            print(f"{step} rolled after {time.monotonic() - t0:.1f} s")
            if len(rolled) < len(platform.orchestrators):
                _wait_running(platform, results)
    finally:
        stop.set()
        loader.join(180)
    assert not failure, failure
    assert rolled == ["orchestrator-0", "orchestrator-1"]
    broken = [r for r in results if r.status != 200 or not r.done or r.errors]
    wrong = [r for r in results if not broken and r.text != reference[r.prompt]]
    print(f"\n{len(results)} streams during the roll; broken {len(broken)}; wrong text {len(wrong)}")
    if broken:
        print("broken:", Counter(r.errors[0][:90] if r.errors else f"status {r.status}" for r in broken))
    assert not broken, broken[:3]
    assert not wrong, [(r.prompt, len(r.text), len(reference[r.prompt])) for r in wrong[:3]]

    # The handover happened, with streams running on the sockets handed over, and ended in time.
    handovers = _events(platform, "node_handover")
    carried = sum(int(str(e["in_flight"])) for e in handovers)
    print(f"{len(handovers)} sockets handed over carrying {carried} streams")
    assert len(handovers) >= 6  # the 2 nodes of replica 0, then all 4 on replica 1
    assert carried > 0
    assert not _events(platform, "node_handover_timeout")

    total = len(results) + PROMPTS
    rows = wait_until(lambda: len(r := settled_rows(migrated_db_url)) >= total and r, 30, "every settle")
    assert len(rows) == total  # one settled row per request: none billed twice, none missed
    assert len({r[0] for r in rows}) == total
    billed = sum(completion for _, _, completion in rows)
    assert billed == sum(_tokens(r.prompt) for r in results) + sum(_tokens(p) for p in range(PROMPTS))
    assert ledger_totals(migrated_db_url).reserved == 0
    balance, expected = balance_consistent(migrated_db_url)
    assert balance == expected
