"""An embedding model in the stack spec (`serving.task: embed`, issue 31): the shipped one loads with
its config's facts, and each task's fields are required for it and refused for the other, with the
field path and the reason."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from apps.core.errors import SpecError
from apps.core.spec import STACKS_DIR, load_spec, parse_spec

EMBED = "bge-m3"
CHAT = "llama-3.1-8b-instruct"


def _data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((STACKS_DIR / "prod.yaml").read_text())
    return data


def _refused(data: dict[str, Any], where: str, reason: str) -> None:
    with pytest.raises(SpecError, match=rf"x\.yaml: {re.escape(where)}: {reason}"):
        parse_spec(data, "x.yaml")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_shipped_embedding_model_is_bge_m3_as_its_config_describes(stack: str) -> None:
    model = load_spec(stack).models[EMBED]
    serving = model.serving
    assert serving.task == "embed"
    # config.json: XLMRobertaModel, 24 layers, 16 heads x 64 = hidden 1024, 8194 positions (8192 tokens).
    assert (model.layers, model.kv_heads, model.head_dim, model.max_context) == (24, 16, 64, 8192)
    assert model.parameters_b == pytest.approx(0.568)
    assert model.embedding_dimensions == 1024 == model.kv_heads * model.head_dim
    assert re.fullmatch(r"[0-9a-f]{7}", model.revision)
    prices = model.prices
    assert prices.completion_per_million_microcredits == 0 < prices.prompt_per_million_microcredits
    assert serving.prompt_tokens_per_s_per_replica is not None
    assert serving.output_tokens_per_s_per_replica is None
    assert serving.resume_streams is False  # nothing streams: off without being written in the file
    assert serving.streams_per_replica is None  # derived by the plan from the prompt-token rate
    assert serving.max_model_len <= model.max_context
    assert serving.planning_context_tokens < serving.max_model_len  # a mean input, not the longest


def test_a_generate_model_keeps_its_defaults() -> None:
    serving = load_spec("prod").models[CHAT].serving
    assert serving.task == "generate"
    assert serving.prompt_tokens_per_s_per_replica is None
    assert serving.output_tokens_per_s_per_replica == 1500
    assert serving.resume_streams is True


def test_embedding_dimensions_belong_to_an_embed_model_only() -> None:
    data = _data()
    del data["models"][EMBED]["embedding_dimensions"]
    _refused(data, f"models.{EMBED}", "embedding_dimensions is required for a model with serving.task: embed")
    data = _data()
    data["models"][CHAT]["embedding_dimensions"] = 4096
    _refused(data, f"models.{CHAT}", "embedding_dimensions is required")


def test_each_task_has_its_own_throughput_field() -> None:
    data = _data()
    del data["models"][EMBED]["serving"]["prompt_tokens_per_s_per_replica"]
    _refused(data, f"models.{EMBED}.serving", "prompt_tokens_per_s_per_replica is required for task: embed")
    data = _data()
    data["models"][EMBED]["serving"]["output_tokens_per_s_per_replica"] = 100
    _refused(data, f"models.{EMBED}.serving", "output_tokens_per_s_per_replica: an embed model decodes")
    data = _data()
    del data["models"][CHAT]["serving"]["output_tokens_per_s_per_replica"]
    _refused(data, f"models.{CHAT}.serving", "output_tokens_per_s_per_replica is required for task: generate")
    data = _data()
    del data["models"][CHAT]["serving"]["streams_per_replica"]
    _refused(data, f"models.{CHAT}.serving", "streams_per_replica is required for task: generate")
    data = _data()
    data["models"][CHAT]["serving"]["prompt_tokens_per_s_per_replica"] = 40000
    _refused(data, f"models.{CHAT}.serving", "prompt_tokens_per_s_per_replica applies to task: embed only")


def test_an_embed_model_resumes_nothing_caches_nothing_and_bills_no_completion() -> None:
    data = _data()
    data["models"][EMBED]["serving"]["resume_streams"] = True
    _refused(data, f"models.{EMBED}.serving", "resume_streams: an embed model answers in one piece")
    data = _data()
    data["models"][EMBED]["serving"]["prefix_hit_rate"] = 0.5
    _refused(data, f"models.{EMBED}.serving", "prefix_hit_rate: an embed model keeps no prefix cache")
    data = _data()
    data["models"][EMBED]["prices"]["completion_per_million_microcredits"] = 1000
    _refused(data, f"models.{EMBED}", "prices.completion_per_million_microcredits: an embed model produces")
    # Written out as off, it loads: the default only fills in what the file leaves out.
    data = _data()
    data["models"][EMBED]["serving"]["resume_streams"] = False
    assert parse_spec(data, "x.yaml").models[EMBED].serving.resume_streams is False


def test_a_dumped_spec_loads_again() -> None:
    """What-if variants (`with_overrides`) validate the dump of a loaded spec: it must round-trip."""
    spec = load_spec("prod")
    assert parse_spec(spec.model_dump(), "again") == spec
