"""The sharing model's vocabulary: priority classes, their vLLM priority, team weights.

A request belongs to a team (its weight in the weighted fair queue, default 1) and to a priority
class (the key's or the JWT claim's): `interactive` (the default) or `batch`. The orchestrator
serves batch only when no interactive request waits for the model, and passes the class to the
engine as vLLM's per-request `priority` (lower is served first; the Deployments run vLLM with
`--scheduling-policy priority`, enginesim implements the same policy).
"""

from __future__ import annotations

import enum
import math

from apps.core.errors import InvalidRequest

DEFAULT_WEIGHT = 1.0
MAX_WEIGHT = 1000.0


class PriorityClass(enum.StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


# vLLM's `priority` field: lower values are scheduled (and kept under preemption) first.
VLLM_PRIORITY: dict[PriorityClass, int] = {PriorityClass.INTERACTIVE: 0, PriorityClass.BATCH: 10}


def priority_class(value: object, param: str = "priority_class") -> PriorityClass:
    """A class from an admin body or a JWT claim (None: the default); anything else is a 400."""
    if value is None:
        return PriorityClass.INTERACTIVE
    if isinstance(value, str):
        try:
            return PriorityClass(value)
        except ValueError:
            pass
    known = ", ".join(repr(c.value) for c in PriorityClass)
    raise InvalidRequest(f"'{param}' must be one of {known}, not {value!r}.", param=param)


ALL_CLASSES: tuple[PriorityClass, ...] = tuple(PriorityClass)


def priority_classes(value: object, param: str = "priority_classes") -> tuple[PriorityClass, ...]:
    """The classes a team may use (an admin body): a non-empty list of known class names."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"'{param}' must be a non-empty list of class names.", param=param)
    chosen = {priority_class(v, param) for v in value}
    return tuple(c for c in PriorityClass if c in chosen)


def team_weight(value: object, param: str = "weight") -> float:
    """A team's weight: a finite number in (0, 1000]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"'{param}' must be a number.", param=param)
    if not 0 < value <= MAX_WEIGHT:
        raise InvalidRequest(f"'{param}' must be greater than 0 and at most {MAX_WEIGHT:g}.", param=param)
    return float(value)
