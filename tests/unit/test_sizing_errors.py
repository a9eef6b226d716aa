"""Bad sizing input raises a ValueError naming the field; the CLI prints one line and exits 2."""

from __future__ import annotations

import pytest

from apps.cli.main import main
from apps.core.errors import SpecError
from apps.core.sizing import kv
from apps.core.sizing.kv import GIB


def test_zero_memory_names_the_field() -> None:
    with pytest.raises(ValueError, match="gpu_memory"):
        kv.kv_budget_bytes(
            gpu_memory_bytes=0,
            gpus=1,
            gpu_memory_utilization=0.9,
            weights_bytes=1,
            activation_reserve_bytes_per_gpu=0,
        )


def test_negative_memory_is_refused() -> None:
    with pytest.raises(SpecError, match="gpu_memory"):
        kv.kv_budget_bytes(
            gpu_memory_bytes=-1,
            gpus=1,
            gpu_memory_utilization=0.9,
            weights_bytes=1,
            activation_reserve_bytes_per_gpu=0,
        )


def test_weights_larger_than_the_gpus() -> None:
    with pytest.raises(SpecError, match="weights") as info:
        kv.kv_budget_bytes(
            gpu_memory_bytes=44 * GIB,
            gpus=1,
            gpu_memory_utilization=0.9,
            weights_bytes=140 * GIB,
            activation_reserve_bytes_per_gpu=2 * GIB,
        )
    assert info.value.param == "weights"


def test_weights_that_fit_on_no_power_of_two() -> None:
    with pytest.raises(SpecError, match="weights"):
        kv.tensor_parallel_size(
            gpu_memory_bytes=44 * GIB,
            gpu_memory_utilization=0.9,
            weights_bytes=1000 * GIB,
            activation_reserve_bytes_per_gpu=2 * GIB,
            min_kv_bytes=0,
        )


def test_context_longer_than_the_model_allows() -> None:
    with pytest.raises(SpecError, match="context_tokens 9000 is longer than the model allows"):
        kv.check_context(9000, 8192)


def test_unknown_dtype() -> None:
    with pytest.raises(SpecError, match="unknown dtype 'fp7'"):
        kv.dtype_bytes("fp7", "weight_dtype")


def test_cli_turns_bad_input_into_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod", "--context", "200000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "max_model_len 200000 is longer than the model allows" in err
    assert "Traceback" not in err


def test_cli_unknown_gpu_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu-type", "h100"]) == 2
    assert "unknown GPU type 'h100' (known: l40s)" in capsys.readouterr().err


def test_cli_bad_streams_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--streams", "llama-3.1-8b-instruct=lots"]) == 2
    assert "--streams: expected MODEL=N" in capsys.readouterr().err
