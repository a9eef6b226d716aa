"""`llmfleet enginesim` argument handling: profiles listable without a model; serving needs one."""

from __future__ import annotations

import pytest

from apps.cli.main import main


def test_list_profiles_needs_no_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enginesim", "--list-profiles"]) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-8b-instruct" in out
    assert "tiny" in out


def test_serving_without_a_model_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enginesim", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--model is required" in err
    assert err.count("\n") == 1


def test_unknown_profile_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enginesim", "--model", "m", "--profile", "gpt-9", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "gpt-9" in err
    assert "llama-3.1-8b-instruct" in err
