"""The daily ledger-drift job as a CronJob: `llmfleet ops drift` over the previous UTC day.

It reads the ledger (the app secret's database URL) and Prometheus, prints both token counts
and the drift, and exits 1 above the stack's threshold: the failed Job is what
`LlmfleetLedgerDriftJobFailed` (kube-state-metrics' `kube_job_status_failed`) alerts on.
"""

from __future__ import annotations

from infra.manifests.alerts import DRIFT_JOB
from infra.manifests.appenv import OpsSettings, from_secret
from infra.manifests.common import PROMETHEUS_URL, Manifest, labels, meta, restricted_context
from infra.manifests.platform import APP_SECRET, SYSTEM_POOL_SELECTOR, app_secret_key

DRIFT_SCHEDULE = "20 0 * * *"  # 00:20 UTC: the previous day's scrapes are in


def drift_cron_job(stack: str, image: str) -> Manifest:
    args = [
        "ops", "drift", "--stack", stack, "--from", "yesterday", "--to", "today",
        "--prometheus-url", PROMETHEUS_URL,
    ]  # fmt: skip
    container = {
        "name": "drift",
        "image": image,
        "args": args,
        "env": [
            from_secret(OpsSettings, "database_url", APP_SECRET, app_secret_key("database_url")),
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": restricted_context(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": meta(DRIFT_JOB, "ops"),
        "spec": {
            "schedule": DRIFT_SCHEDULE,
            "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 0,  # a drift above target is an answer, not a crash to retry
                    "activeDeadlineSeconds": 600,
                    "template": {
                        "metadata": {"labels": labels("ops")},
                        "spec": {
                            "restartPolicy": "Never",
                            "nodeSelector": dict(SYSTEM_POOL_SELECTOR),
                            "securityContext": {
                                "runAsNonRoot": True,
                                "runAsUser": 10001,
                                "runAsGroup": 10001,
                            },
                            "containers": [container],
                        },
                    },
                }
            },
        },
    }
