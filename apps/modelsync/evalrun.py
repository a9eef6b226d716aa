"""Run a golden set on one model revision through the platform's own API (issue 30 item 2).

Each case is a streamed chat completion with the official OpenAI SDK against the gateway, at
temperature 0, pinned to the revision with the `x-llmfleet-model-revision` header (only an admin
JWT may pin: `apps/gateway/validate.py`). The request takes the path a team's does (admission,
reservation, the fair queue, settle: the evaluation's tokens are billed to the admin's team) but runs
only on nodes of that revision, which take no production traffic while the revision is not live
(a canary at weight 0). Cases run one after another, so the TTFT measured is the candidate's, not
the evaluation's own queue. The answer's text stays in memory for the grade; it is never logged
or written.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import openai

from apps.core.protocol.dispatch import MODEL_REVISION_HEADER
from apps.modelsync.evalsuite import Answer, Case, Suite


async def run_suite(
    suite: Suite,
    *,
    base_url: str,
    api_key: str,
    model: str,
    revision: str,
    timeout_s: float = 120.0,
    monotonic: Callable[[], float] = time.monotonic,
) -> list[Answer]:
    """Every case's answer (a failed request is an answer with its error, not an exception)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
    try:
        return [await _ask(client, case, model, revision, monotonic) for case in suite.cases]
    finally:
        await client.close()


async def _ask(
    client: openai.AsyncOpenAI, case: Case, model: str, revision: str, monotonic: Callable[[], float]
) -> Answer:
    started = monotonic()
    first: float | None = None
    parts: list[str] = []
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=case.messages,  # type: ignore[arg-type]  # the suite's, validated as dicts
            max_tokens=case.max_tokens,
            temperature=0,
            stream=True,
            extra_headers={MODEL_REVISION_HEADER: revision},
        )
        served = raw.headers.get(MODEL_REVISION_HEADER, "")
        stream = raw.parse()  # the raw response's parse is synchronous (the SDK's legacy response)
        if not isinstance(stream, openai.AsyncStream):
            return Answer(case.name, "", None, served, error="not a stream")
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    if first is None:
                        first = monotonic()
                    parts.append(choice.delta.content)
    except openai.APIStatusError as exc:
        return Answer(case.name, "", None, "", error=_code(exc))
    except openai.APIError as exc:  # the connection, a timeout, an error event mid-stream
        return Answer(case.name, "", None, "", error=type(exc).__name__)
    ttft = None if first is None else first - started
    return Answer(case.name, "".join(parts), ttft, served)


def _code(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error", body) if isinstance(body, dict) else {}
    code = error.get("code") if isinstance(error, dict) else None
    return f"{exc.status_code} {code}" if code else str(exc.status_code)
