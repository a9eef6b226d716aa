"""Gateway and orchestrator: Deployments, Services, PDBs, the gateway HPA and the ALB ingresses.

Both read their connection strings from the Secret `llmfleet-app` (written by the program
from Aurora / ElastiCache / Secrets Manager outputs). The public ALB terminates TLS for the
OpenAI API and, on a second host, forwards only `/v1/nodes/connect` (WebSocket) to the
orchestrator so on-premises nodes behind NAT can dial in; `/internal/*` is never exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.spec import load_spec
from infra.manifests.appenv import (
    AdminSettings,
    GatewaySettings,
    OrchestratorSettings,
    env_name,
    from_secret,
    value,
)
from infra.manifests.common import (
    GATEWAY_METRICS_PORT,
    GATEWAY_PORT,
    NAMESPACE,
    NODE_PORT,
    ORCHESTRATOR_METRICS_PORT,
    ORCHESTRATOR_PORT,
    PROMETHEUS_URL,
    Manifest,
    labels,
    meta,
    restricted_context,
)

# The public API routes only these (no `/metrics`, no health checks, nothing added later by accident).
PUBLIC_PATHS = ("/v1", "/admin", "/console")

APP_SECRET = "llmfleet-app"
# The settings the app Secret holds, each under the environment name the apps read it from.
APP_SECRET_FIELDS = ("database_url", "redis_url", "internal_token", "secret_key")


def app_secret_key(field: str) -> str:
    """The app Secret's key holding `field` (the same name in every app that reads it)."""
    return env_name(OrchestratorSettings, field)


# Gateway shutdown (docs/deploy.md "Deploys without downtime"): endpoints are removed in parallel with the
# pod's termination, so the preStop sleep keeps it serving while that propagates; then SIGTERM, and
# the streams in flight get GATEWAY_DRAIN_S to finish (a 2k-token answer at 20 tokens/s is 100 s)
# before they are cancelled (and settled); the grace period covers both plus slack for the exit.
PRESTOP_SLEEP_S = 10
GATEWAY_DRAIN_S = 300
GATEWAY_GRACE_S = PRESTOP_SLEEP_S + GATEWAY_DRAIN_S + 20
SYSTEM_POOL_SELECTOR = {"llmfleet.io/pool": "system"}
# Long SSE streams and node WebSockets must outlive the ALB's 60 s default idle timeout. The
# gateway keeps idle connections open longer than the ALB does (AWS: "configure the idle timeout of
# your application to be larger than the idle timeout configured for the load balancer"), so the
# ALB never sends a request on a connection the gateway is closing (a 502 to the client).
ALB_IDLE_TIMEOUT_S = 3600
GATEWAY_KEEPALIVE_S = ALB_IDLE_TIMEOUT_S + 5


@dataclass(frozen=True)
class PlatformTarget:
    gateway_image: str
    orchestrator_image: str
    stack: str
    api_host: str
    nodes_host: str
    certificate_arn: str
    gateway_min_replicas: int
    gateway_max_replicas: int
    orchestrator_replicas: int


@dataclass(frozen=True)
class NodePoolRegistration:
    """The node pool the vLLM pods' agents join and the Secret holding its token."""

    pool: str
    token_secret: str


def _env(app: str, stack: str) -> list[Manifest]:
    settings = GatewaySettings if app == "gateway" else OrchestratorSettings
    env = [from_secret(settings, f, APP_SECRET, app_secret_key(f)) for f in APP_SECRET_FIELDS]
    env.append(value(settings, "stack", stack))
    if app == "gateway":
        env.append(
            value(
                GatewaySettings,
                "orchestrator_url",
                f"http://orchestrator.{NAMESPACE}.svc:{ORCHESTRATOR_PORT}",
            )
        )
        env.append(value(GatewaySettings, "metrics_port", str(GATEWAY_METRICS_PORT)))
        env.append(value(GatewaySettings, "prometheus_url", PROMETHEUS_URL))  # the console's SLO status
        env.append(value(GatewaySettings, "graceful_shutdown_s", str(GATEWAY_DRAIN_S)))
        env.append(value(GatewaySettings, "keepalive_s", str(GATEWAY_KEEPALIVE_S)))
    if app == "orchestrator":
        # KEDA starts replicas from zero here: a request for a model without a node is told when
        # one should be ready (apps/orchestrator/coldstart.py) instead of waiting the queue limit.
        env.append(value(OrchestratorSettings, "scale_from_zero", "true"))
        env.append(value(OrchestratorSettings, "node_port", str(NODE_PORT)))
        env.append(value(OrchestratorSettings, "metrics_port", str(ORCHESTRATOR_METRICS_PORT)))
    return env


def _ports(app: str, port: int) -> list[Manifest]:
    ports: list[Manifest] = [{"name": "http", "containerPort": port}]
    if app == "orchestrator":
        ports.append({"name": "nodes", "containerPort": NODE_PORT})
        ports.append({"name": "metrics", "containerPort": ORCHESTRATOR_METRICS_PORT})
    if app == "gateway":
        ports.append({"name": "metrics", "containerPort": GATEWAY_METRICS_PORT})
    return ports


def _deployment(app: str, image: str, port: int, replicas: int | None, stack: str, grace_s: int) -> Manifest:
    selector = labels(app)
    spec: Manifest = {
        "selector": {"matchLabels": selector},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {"labels": selector},
            "spec": {
                "serviceAccountName": app,
                "nodeSelector": dict(SYSTEM_POOL_SELECTOR),
                "terminationGracePeriodSeconds": grace_s,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
                "containers": [
                    {
                        "name": app,
                        "image": image,
                        "args": [app, "--host", "0.0.0.0", "--port", str(port)],
                        "env": _env(app, stack),
                        "ports": _ports(app, port),
                        "readinessProbe": {
                            "httpGet": {"path": "/readyz", "port": "http"},
                            "periodSeconds": 5,
                        },
                        "livenessProbe": {"httpGet": {"path": "/livez", "port": "http"}, "periodSeconds": 10},
                        # Endpoints are removed in parallel with SIGTERM: keep serving a few seconds.
                        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
                        "resources": {
                            "requests": {"cpu": "500m", "memory": "512Mi"},
                            "limits": {"memory": "1Gi"},
                        },
                        "securityContext": restricted_context(),
                    }
                ],
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": selector},
                    }
                ],
            },
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(app, app), "spec": spec}


def _service(app: str, port: int) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(app, app),
        "spec": {
            "selector": labels(app),
            "ports": [
                {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]}
                for p in _ports(app, port)
            ],
        },
    }


def _pdb(app: str) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(app, app),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(app)}},
    }


def _service_account(app: str) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(app, app)}


def _hpa(t: PlatformTarget) -> Manifest:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta("gateway", "gateway"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"},
            "minReplicas": t.gateway_min_replicas,
            "maxReplicas": t.gateway_max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}},
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
        },
    }


def _ingress(
    name: str, host: str, service: str, port: int, paths: tuple[str, ...], path_type: str, t: PlatformTarget
) -> Manifest:
    annotations = {
        "alb.ingress.kubernetes.io/scheme": "internet-facing",
        "alb.ingress.kubernetes.io/target-type": "ip",
        "alb.ingress.kubernetes.io/group.name": "llmfleet",
        "alb.ingress.kubernetes.io/certificate-arn": t.certificate_arn,
        "alb.ingress.kubernetes.io/listen-ports": '[{"HTTPS": 443}]',
        "alb.ingress.kubernetes.io/ssl-policy": "ELBSecurityPolicy-TLS13-1-2-2021-06",
        "alb.ingress.kubernetes.io/load-balancer-attributes": f"idle_timeout.timeout_seconds={ALB_IDLE_TIMEOUT_S}",
        "alb.ingress.kubernetes.io/healthcheck-path": "/readyz",
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {**meta(name, service), "annotations": annotations},
        "spec": {
            "ingressClassName": "alb",
            "tls": [{"hosts": [host]}],
            "rules": [
                {
                    "host": host,
                    "http": {
                        "paths": [
                            {
                                "path": path,
                                "pathType": path_type,
                                "backend": {"service": {"name": service, "port": {"number": port}}},
                            }
                            for path in paths
                        ]
                    },
                }
            ],
        },
    }


def _job_container(name: str, image: str, args: list[str], env: list[Manifest]) -> Manifest:
    return {
        "name": name,
        "image": image,
        "args": args,
        "env": env,
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": restricted_context(),
    }


def migrate_job(image: str, stack: str, node_pool: NodePoolRegistration) -> Manifest:
    """`llmfleet admin migrate`, then `llmfleet admin register-node-pool` with the cloud node
    token, before the apps roll out (both idempotent; Pulumi replaces the Job on change)."""
    db_env = from_secret(AdminSettings, "database_url", APP_SECRET, app_secret_key("database_url"))
    pool_env = [
        from_secret(AdminSettings, f, APP_SECRET, app_secret_key(f))
        for f in ("database_url", "redis_url", "secret_key")
    ]
    pool_env.append(from_secret(AdminSettings, "node_token", node_pool.token_secret, "token"))
    register_args = ["admin", "register-node-pool", "--pool", node_pool.pool, "--location", "cloud"]
    # The pool's pods serve the stack's catalog and nothing else: a pod with the pool's token that
    # claims another model is refused (issue 21 item 4).
    for model in sorted(load_spec(stack).models):
        register_args += ["--model", model]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta("llmfleet-migrate", "migrate"),
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": 600,
            "template": {
                "metadata": {"labels": labels("migrate")},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "nodeSelector": dict(SYSTEM_POOL_SELECTOR),
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
                    # Init containers run in order and first: the pool row needs the current schema.
                    "initContainers": [_job_container("migrate", image, ["admin", "migrate"], [db_env])],
                    "containers": [_job_container("register-node-pool", image, register_args, pool_env)],
                },
            },
        },
    }


def platform_objects(t: PlatformTarget) -> list[Manifest]:
    return [
        _service_account("gateway"),
        _service_account("orchestrator"),
        # At SIGTERM the gateway turns not-ready, stops listening and lets its streams finish.
        _deployment("gateway", t.gateway_image, GATEWAY_PORT, None, t.stack, GATEWAY_GRACE_S),
        _deployment(
            "orchestrator", t.orchestrator_image, ORCHESTRATOR_PORT, t.orchestrator_replicas, t.stack, 120
        ),
        _service("gateway", GATEWAY_PORT),
        _service("orchestrator", ORCHESTRATOR_PORT),
        _pdb("gateway"),
        _pdb("orchestrator"),
        _hpa(t),
        _ingress("gateway", t.api_host, "gateway", GATEWAY_PORT, PUBLIC_PATHS, "Prefix", t),
        _ingress(
            "orchestrator-nodes",
            t.nodes_host,
            "orchestrator",
            NODE_PORT,
            ("/v1/nodes/connect",),
            "Exact",
            t,
        ),
    ]
