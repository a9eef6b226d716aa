"""Small HTTP helpers shared by the conformance tests (plain httpx, no OpenAI SDK)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class StreamResult:
    status: int
    content_type: str
    payloads: list[str]  # every `data:` payload in order, `[DONE]` included

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(p) for p in self.payloads if p != "[DONE]"]


def chat_body(engine_model: str, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": engine_model, "messages": [{"role": "user", "content": content}], **extra}


def stream_chat(client: httpx.Client, url: str, body: dict[str, Any]) -> StreamResult:
    payloads: list[str] = []
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        ctype = resp.headers.get("content-type", "")
        if resp.status_code != 200 or not ctype.startswith("text/event-stream"):
            resp.read()
            return StreamResult(resp.status_code, ctype, [resp.text])
        for line in resp.iter_lines():
            if line.startswith("data:"):
                payloads.append(line[5:].strip())
    return StreamResult(resp.status_code, ctype, payloads)


def stream_sse(client: httpx.Client, url: str, path: str, body: dict[str, Any]) -> StreamResult:
    """POST `body` to `path` and read the event stream (any endpoint: `/v1/completions`...)."""
    payloads: list[str] = []
    with client.stream("POST", f"{url}{path}", json=body) as resp:
        ctype = resp.headers.get("content-type", "")
        if resp.status_code != 200 or not ctype.startswith("text/event-stream"):
            resp.read()
            return StreamResult(resp.status_code, ctype, [resp.text])
        for line in resp.iter_lines():
            if line.startswith("data:"):
                payloads.append(line[5:].strip())
    return StreamResult(resp.status_code, ctype, payloads)


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    """vLLM's error envelope of `resp` (asserting its status, content type and keys)."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    assert isinstance(err["message"], str)
    assert err["message"]
    return err


def tokens_of(client: httpx.Client, engine_url: str, model: str, prompt: str) -> int:
    """How many prompt tokens the engine's own tokenizer makes of `prompt` (`/tokenize`)."""
    resp = client.post(f"{engine_url}/tokenize", json={"model": model, "prompt": prompt})
    assert resp.status_code == 200, resp.text
    count: int = resp.json()["count"]
    return count


def metric_values(client: httpx.Client, url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = client.get(f"{url}/metrics").text
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def metric(values: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    found = [v for (n, lbl), v in values.items() if n == name and want <= set(lbl)]
    if not found:
        raise AssertionError(f"metric {name}{labels} not exposed")
    return sum(found)


def poll_until(predicate: Any, deadline_s: float, interval_s: float = 0.05) -> Any:
    """Call `predicate()` until it returns a truthy value or the deadline passes (then AssertionError)."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)  # polling interval with a deadline, not a wait for an event
    raise AssertionError(f"condition not met within {deadline_s} s (last value {last!r})")
