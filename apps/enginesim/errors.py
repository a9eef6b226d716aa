"""vLLM 0.32's error bodies, as enginesim writes them for every endpoint (measured: `docs/vllm-facts.md`
§1, `docs/vllm-versions.md`, `docs/enginesim.md`).

`{"error": {"message", "type", "param", "code"}}` with HTTP status = `code`. Request-model (pydantic)
problems are `type "Bad Request"`: "N validation error(s):" then at most ten errors, each with its
`type`, cleaned `loc`, `msg`, summarised `input` and `ctx`, `param` the first one's field.
Handler-level problems are `BadRequestError`, their message ending in ` (parameter=X, value=V)`
when vLLM names the parameter. An unknown model is a 404 `NotFoundError`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError


class VllmError(Exception):
    def __init__(self, status: int, type_: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}
        }


def bad_request(message: str, param: str | None = None, value: object = None) -> VllmError:
    suffix = ""
    if param is not None:
        suffix = f" (parameter={param}, value={value})" if value is not None else f" (parameter={param})"
    return VllmError(400, "BadRequestError", message + suffix, param)


_INTERNAL_LOC = frozenset(
    [
        "function-wrap",
        "function-after",
        "function-before",
        "function-plain",
        "json-or-python",
        "lax-or-strict",
        "chain",
        "default",
        "nullable",
        "tagged-union",
        "union",
        "call",
        "arguments",
        "is-instance",
        "is-subclass",
        "callable",
        "str",
        "int",
        "float",
        "bool",
        "bytes",
        "bytearray",
        "list",
        "tuple",
        "dict",
        "set",
        "frozenset",
        "complex",
        "none",
        "nonetype",
    ]
)


def _clean_loc(loc: tuple[int | str, ...]) -> str:
    """vLLM's `clean_loc_for_param`: the dotted path without pydantic's union-branch markers
    (`list[int]`, `str`, `function-before[...]`), so `prompt=1` is `body.prompt`."""
    parts = [
        str(p)
        for p in ("body", *loc)
        if not any(c in str(p) for c in "[]{}()") and str(p).lower() not in _INTERNAL_LOC
    ]
    return ".".join(parts)


def summarize_input(value: object) -> object:
    """vLLM's `_summarize_error_input`: an error's `input` as its message shows it."""
    if isinstance(value, str):
        return value[:200] + "...[truncated]" if len(value) > 200 else value
    if isinstance(value, bytes | bytearray):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


def _error_line(err: dict[str, Any]) -> str:
    shown = {k: v for k, v in err.items() if k != "url"}
    shown["loc"] = _clean_loc(err["loc"])
    if "input" in shown:
        shown["input"] = summarize_input(shown["input"])
    text = str(shown)
    return text[:1000] + "...[truncated]" if len(text) > 1000 else text


def validation_error(exc: ValidationError) -> VllmError:
    """A pydantic error as vLLM's request-validation handler writes it ("Bad Request", at most ten
    errors listed, `param` the first error's field)."""
    details = exc.errors(include_url=False)
    n = len(details)
    label = "error" if n == 1 else "errors"
    message = f"{n} validation {label}:\n" + "".join(f"  {_error_line(dict(e))}\n" for e in details[:10])
    if n > 10:
        message += f"  ...and {n - 10} more {label}\n"
    return VllmError(400, "Bad Request", message.rstrip(), _clean_loc(details[0]["loc"]))


def not_an_object(body: object, copies: int = 1) -> VllmError:
    """A JSON body that is not an object (`copies`: how many request models vLLM tried)."""
    line = (
        "  {'type': 'model_attributes_type', 'loc': 'body', 'msg': 'Input should be a valid dictionary or "
        f"object to extract fields from', 'input': {summarize_input(body)!r}}}"
    )
    label = "error" if copies == 1 else "errors"
    return VllmError(
        400, "Bad Request", f"{copies} validation {label}:\n" + "\n".join([line] * copies), "body"
    )


def unknown_model(model: str | None, served_model: str) -> VllmError:
    return VllmError(
        404, "NotFoundError", f"The model `{model}` does not exist. Valid aliases: {served_model}.", "model"
    )


def prompt_too_long(max_model_len: int, count: int) -> VllmError:
    """vLLM's context check; a text prompt is tokenized up to `max_model_len + 1` tokens, hence
    "at least" for that count."""
    qualifier = "at least " if count == max_model_len + 1 else ""
    return bad_request(
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
        f"{qualifier}{count} input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt.",
        "input_tokens",
        count,
    )


def parse_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        msg = (
            "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.0', 'msg': 'JSON decode error', "
            f"'input': '<dict of 0 items>', 'ctx': {{'error': {str(exc).split(':')[0]!r}}}}}"
        )
        raise VllmError(400, "Bad Request", msg, "body.0") from None
