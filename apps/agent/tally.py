"""What the engine has generated for one request so far, read from the engine's own usage.

The agent asks vLLM for `stream_options.continuous_usage_stats: true`: every chunk (the role
chunk with `completion_tokens: 0`) then carries `"usage":{"prompt_tokens":P,...,
"completion_tokens":N}` with the running count **of that chunk's choice** (vLLM's
`previous_num_tokens[i]`; one choice per chunk). After an abort or a mid-stream failure the
engine sends no final usage chunk, so the last running count per choice is what is billed —
exact even when vLLM merges several tokens into one chunk or generates a token without a
chunk (a tool-call parser's control token), which counting chunks misses.

`TokenTally.take()` notes one event and returns the bytes the client gets: the per-chunk
`usage` the client did not ask for is cut out (`,"usage":{...}` — vLLM writes it after
`choices`, so the rest of the event is byte for byte what it sends without the option). No
JSON parse: the usage object holds only keys and numbers (and `null` or one nested object of
numbers), and inside a JSON string a `"` is always escaped, so `,"usage":{` cannot occur in
text; the last occurrence is the top-level key.

An engine that sends no per-chunk usage (an older vLLM, a stand-in) leaves the tally empty; the
relay then counts content chunks, as before.
"""

from __future__ import annotations

_USAGE_KEY = b',"usage":{'
_INDEX_KEY = b'"choices":[{"index":'
_PROMPT_KEY = b'"prompt_tokens":'
_COMPLETION_KEY = b'"completion_tokens":'


def _int_after(buf: bytes, at: int, stop: int) -> int | None:
    """The JSON integer that starts at `at` and ends at the next `,` or `}` before `stop`."""
    end = buf.find(b",", at, stop)
    if end < 0:
        end = buf.find(b"}", at, stop)
    try:
        return int(buf[at : end if end >= 0 else stop])
    except ValueError:
        return None


def _field(buf: bytes, key: bytes, start: int, stop: int) -> int | None:
    at = buf.find(key, start, stop)
    return None if at < 0 else _int_after(buf, at + len(key), stop)


def _usage_end(payload: bytes, start: int) -> int:
    """Index just past the `}` that closes the usage object opened before `start`; -1 if none."""
    close = payload.find(b"}", start)
    if close >= 0 and payload.find(b"{", start, close) < 0:
        return close + 1  # the usual case: no nested object (`completion_tokens_details` null)
    depth = 1
    at = start
    while depth:
        close = payload.find(b"}", at)
        if close < 0:
            return -1
        opened = payload.find(b"{", at, close)
        if opened >= 0:
            depth += 1
            at = opened + 1
        else:
            depth -= 1
            at = close + 1
    return at


class TokenTally:
    """`keep_chunk_usage`: the client itself asked for `continuous_usage_stats` (its chunks keep it).
    `choices`: the request's `n`; with one choice every chunk is choice 0 and its index is not read.

    Per chunk only the usage object is located (and cut out); its numbers are read when they are
    needed, after an abort or a failure, from the last chunk kept per choice."""

    __slots__ = ("_last", "_one_choice", "keep_chunk_usage")

    def __init__(self, keep_chunk_usage: bool = False, choices: int = 1) -> None:
        self.keep_chunk_usage = keep_chunk_usage
        self._one_choice = choices == 1
        self._last: dict[int, tuple[bytes, int, int]] = {}  # choice -> (payload, usage start, end)

    @property
    def seen(self) -> bool:
        """The engine reported a running count (else the relay falls back to counting chunks)."""
        return bool(self._last)

    @property
    def completion_tokens(self) -> int:
        """Completion tokens generated so far, summed over choices (as the final usage sums them)."""
        return sum(_field(p, _COMPLETION_KEY, body, end) or 0 for p, body, end in self._last.values())

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt as the engine counted it (the same on every chunk), once a chunk carried it."""
        for payload, body, end in self._last.values():
            return _field(payload, _PROMPT_KEY, body, end)
        return None

    def take(self, payload: bytes) -> bytes:
        """Note one chunk event's usage; the event's payload as it is forwarded."""
        at = payload.rfind(_USAGE_KEY)
        if at < 0:
            return payload
        body = at + len(_USAGE_KEY)
        end = _usage_end(payload, body)
        if end < 0:
            return payload  # not an object we understand: forwarded untouched, not counted
        if self._one_choice:
            index = 0
        else:
            index_at = payload.find(_INDEX_KEY, 0, at)
            index = (_int_after(payload, index_at + len(_INDEX_KEY), at) or 0) if index_at >= 0 else 0
        self._last[index] = (payload, body, end)
        if self.keep_chunk_usage:
            return payload
        return payload[:at] + payload[end:]
