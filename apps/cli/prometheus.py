"""A real Prometheus next to a `LocalPlatform`: `llmfleet dev --prometheus` and the observability tests.

It scrapes every process of the platform (gateway, orchestrators, agents' health ports, the
engines' `vllm:*` pages) and loads the same rule groups as the cluster's PrometheusRule
(`infra.manifests.alerts`, thresholds from the platform's stack). The binary is Debian's
`prometheus` (on PATH, or `DevSettings.prometheus`); it listens on loopback on a free port, keeps
its TSDB in the data directory and runs as a supervised child of the platform.
"""

from __future__ import annotations

import shutil
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from apps.cli.platform import LocalPlatform
from apps.cli.procs import Child, free_port
from apps.cli.settings import DevSettings
from apps.core.envnames import env_name
from apps.core.errors import LlmfleetError
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec
from infra.config import OfficeHours
from infra.manifests.alerts import rules_file


class PrometheusMissing(LlmfleetError):
    status = 500
    type = "server_error"
    code = "prometheus_missing"


def prometheus_binary() -> str:
    found = DevSettings().prometheus or shutil.which("prometheus")
    if not found:
        raise PrometheusMissing(
            "the prometheus binary is not on PATH (Debian: `apt-get install prometheus`;"
            f" or set {env_name(DevSettings, 'prometheus')}=/path/to/prometheus)"
        )
    return found


Target = tuple[str, dict[str, str]]  # host:port, extra target labels


def scrape_targets(platform: LocalPlatform) -> dict[str, list[Target]]:
    """job -> every process of the platform that serves /metrics, with the labels the cluster's
    ServiceMonitors give (engines: `location`, as the cost report selects on it)."""
    host = "127.0.0.1"
    engines: dict[int, dict[str, str]] = {}
    for engine in platform.engines.values():
        engines.setdefault(engine.port, {"location": engine.spec.location, "node_id": engine.spec.node_id})
    return {
        "gateway": [(f"{host}:{platform.gateway_port}", {})],
        "orchestrator": [(f"{host}:{port}", {}) for port in platform.orchestrator_ports],
        "agent": [(f"{host}:{port}", {"node_id": n}) for n, port in platform.agent_health_ports.items()],
        "vllm": [(f"{host}:{port}", labels) for port, labels in sorted(engines.items())],
    }


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"  # Prometheus durations take no fractions


@dataclass
class LocalPrometheus:
    platform: LocalPlatform
    scrape_interval_s: float = 2.0
    engine_scrape_interval_s: float | None = None  # the engines' own (a killed one loses less)
    extra_targets: dict[str, list[Target]] = field(default_factory=dict)  # job -> more targets
    port: int = 0
    child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_config(self, folder: Path) -> Path:
        spec = load_spec(self.platform.config.stack)
        (folder / "rules.yaml").write_text(yaml.safe_dump(rules_file(spec, plan_fleet(spec), OfficeHours())))
        jobs = {**scrape_targets(self.platform), **self.extra_targets}
        config = {
            "global": {
                "scrape_interval": _duration(self.scrape_interval_s),
                "evaluation_interval": _duration(self.scrape_interval_s),
            },
            "rule_files": ["rules.yaml"],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [{"targets": [t], "labels": labels} for t, labels in targets],
                    **(
                        {"scrape_interval": _duration(self.engine_scrape_interval_s)}
                        if job == "vllm" and self.engine_scrape_interval_s
                        else {}
                    ),
                }
                for job, targets in jobs.items()
                if targets
            ],
        }
        path = folder / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self, timeout_s: float = 60.0) -> str:
        binary = prometheus_binary()
        folder = self.platform.data_dir / "prometheus"
        (folder / "tsdb").mkdir(parents=True, exist_ok=True)
        config = self.write_config(folder)
        self.port = self.port or free_port()
        argv = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=7d",
        ]
        supervisor = self.platform.supervisor
        self.child = supervisor.start("prometheus", argv)
        supervisor.wait_http_ok(self.child, self.url + "/-/ready", timeout_s)
        return self.url

    def reload(self) -> None:
        """Rewrite the configuration from the platform's current processes and reload it."""
        self.write_config(self.platform.data_dir / "prometheus")
        request = urllib.request.Request(self.url + "/-/reload", method="POST")  # noqa: S310 - loopback
        with urllib.request.urlopen(request, timeout=10):  # noqa: S310 - our loopback URL
            pass

    def stop(self) -> None:
        if self.child is not None:
            self.platform.stop_child(self.child)
            self.child = None
