"""Loading a stack spec: the shipped stacks load, and a broken file fails with file, field path and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from apps.core.errors import SpecError
from apps.core.spec import STACKS_DIR, load_spec, parse_spec

CATALOG = {"llama-3.1-8b-instruct", "qwen2.5-32b-instruct", "llama-3.3-70b-instruct-fp8", "bge-m3"}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_shipped_stacks_load(stack: str) -> None:
    spec = load_spec(stack)
    assert set(spec.models) == CATALOG
    m70 = spec.models["llama-3.3-70b-instruct-fp8"]
    assert (m70.layers, m70.kv_heads, m70.head_dim, m70.weight_dtype) == (80, 8, 128, "fp8")
    assert [n for n, m in spec.models.items() if m.serving.task == "embed"] == ["bge-m3"]
    assert spec.slo.queue_limit_s == 30


def _prod_data() -> dict[str, object]:
    data = yaml.safe_load((STACKS_DIR / "prod.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_missing_field_names_file_and_path(tmp_path: Path) -> None:
    data = _prod_data()
    del data["models"]["qwen2.5-32b-instruct"]["layers"]  # type: ignore[index]
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    message = info.value.message
    assert str(path) in message
    assert "models.qwen2.5-32b-instruct.layers" in message
    assert "Field required" in message


def test_mistyped_field() -> None:
    data = _prod_data()
    data["models"]["llama-3.1-8b-instruct"]["kv_heads"] = "eight"  # type: ignore[index]
    with pytest.raises(
        SpecError, match=r"models\.llama-3\.1-8b-instruct\.kv_heads: Input should be a valid integer"
    ):
        parse_spec(data, "x.yaml")


def test_unknown_field_is_refused() -> None:
    data = _prod_data()
    data["models"]["llama-3.1-8b-instruct"]["layer"] = 32  # type: ignore[index]
    with pytest.raises(SpecError, match="layer: Extra inputs are not permitted"):
        parse_spec(data, "x.yaml")


def test_unknown_dtype_and_gpu_type() -> None:
    data = _prod_data()
    data["models"]["llama-3.1-8b-instruct"]["weight_dtype"] = "fp7"  # type: ignore[index]
    with pytest.raises(SpecError, match="unknown dtype 'fp7'"):
        parse_spec(data, "x.yaml")
    data = _prod_data()
    data["models"]["llama-3.1-8b-instruct"]["serving"]["gpu_type"] = "h100"  # type: ignore[index]
    with pytest.raises(SpecError, match="unknown GPU type 'h100'"):
        parse_spec(data, "x.yaml")


def test_negative_memory_in_spec() -> None:
    data = _prod_data()
    data["gpu_types"]["l40s"]["memory_gib"] = -44  # type: ignore[index]
    with pytest.raises(SpecError, match=r"gpu_types\.l40s\.memory_gib: Input should be greater than 0"):
        parse_spec(data, "x.yaml")


def test_missing_file() -> None:
    with pytest.raises(SpecError, match="cannot read stack spec"):
        load_spec("does-not-exist")
