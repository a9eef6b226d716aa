"""Fast checks of what `llmfleet dev` will start, without starting it."""

from __future__ import annotations

import argparse
from pathlib import Path

from apps.cli import dev
from apps.cli.platform import (
    MODEL_8B,
    MODEL_32B,
    MODEL_70B,
    MODEL_EMBED,
    Credentials,
    LocalPlatform,
    PlatformConfig,
    dev_nodes,
)
from apps.core.spec import load_spec


def test_dev_fleet_is_two_8b_one_onprem_one_32b_one_70b_one_embedder_all_in_the_dev_catalog() -> None:
    nodes = dev_nodes()
    assert sorted((n.model, n.location) for n in nodes) == sorted(
        [
            (MODEL_8B, "onprem"),
            (MODEL_8B, "cloud"),
            (MODEL_32B, "cloud"),
            (MODEL_70B, "cloud"),
            (MODEL_EMBED, "cloud"),
        ]
    )
    assert len({n.node_id for n in nodes}) == 5
    assert {n.model for n in nodes} == set(load_spec("dev").models)


def test_credentials_lines_and_file_mode(tmp_path: Path) -> None:
    creds = Credentials("http://127.0.0.1:8080/v1", "sk-lf-x", "jwt")
    lines = creds.env_lines()
    assert lines == [
        "OPENAI_BASE_URL=http://127.0.0.1:8080/v1",
        "OPENAI_API_KEY=sk-lf-x",
        "LLMFLEET_ADMIN_TOKEN=jwt",
    ]
    path = tmp_path / "d" / "credentials.env"
    dev._write_credentials(path, lines)
    assert path.read_text().splitlines() == lines
    assert path.stat().st_mode & 0o777 == 0o600


def test_platform_keeps_its_secrets_and_issuer_key_across_restarts(tmp_path: Path) -> None:
    first = LocalPlatform(PlatformConfig(data_dir=tmp_path))
    second = LocalPlatform(PlatformConfig(data_dir=tmp_path))
    assert first.secrets == second.secrets
    assert first.issuer.kid == second.issuer.kid
    assert (tmp_path / "secrets.json").stat().st_mode & 0o777 == 0o600
    assert first._plan[MODEL_8B][0] > 0  # max_num_seqs from the stack's plan, as vLLM would get


def test_dev_cli_defaults() -> None:
    parser = argparse.ArgumentParser()
    dev.configure(parser)
    args = parser.parse_args([])
    assert args.port == 8080
    assert args.data_dir == Path(".llmfleet-dev")
