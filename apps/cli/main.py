"""`llmfleet <command>`: one console script, one module per subcommand.

Each subcommand lives in its app as a module with `configure(parser)` and
`run(args) -> int`. Only the chosen module is imported, so `llmfleet plan` does not
pay for Pulumi and `llmfleet agent` does not pay for Starlette. A `SpecError` or any
other `LlmfleetError` becomes one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from apps.core.errors import LlmfleetError

COMMANDS: dict[str, tuple[str, str]] = {
    "dev": ("apps.cli.dev", "start the whole platform on this machine (embedded PostgreSQL and Redis)"),
    "plan": ("apps.planner.cli", "print the capacity plan of a stack (KV cache, GPUs, cost, queue budget)"),
    "gateway": ("apps.gateway.cli", "run the OpenAI-compatible gateway (Starlette on uvicorn)"),
    "orchestrator": ("apps.orchestrator.cli", "run the node control plane (aiohttp)"),
    "agent": ("apps.agent.cli", "run the node agent: dial out to the orchestrator, serve the local engine"),
    "enginesim": ("apps.enginesim.cli", "run the vLLM-compatible engine simulator"),
    "loadgen": ("apps.loadgen.cli", "load generator for any OpenAI-compatible endpoint"),
    "admin": ("apps.cli.admin", "administration: migrate the database, teams, keys, credits, nodes"),
    "infra": ("infra.cli", "render the Pulumi program offline (`llmfleet infra render --stack prod`)"),
    "model-sync": ("apps.modelsync.cli", "copy a verified model revision from S3 to the local NVMe cache"),
    "model": (
        "apps.modelsync.model_cli",
        "model versions: `model publish` uploads and signs a revision; `canary`, `promote`, `rollback`, `status`",
    ),
    "simulate": (
        "apps.simulate.cli",
        "discrete-event what-if of the fleet (KEDA, Karpenter, engines) under a load trace",
    ),
    "ops": (
        "apps.ops.cli",
        "operations jobs: `ops drift` (ledger vs engines), `ops cost-report` (weekly), `ops audit` (per request)",
    ),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: llmfleet <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`llmfleet <command> --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"llmfleet: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, help_ = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"llmfleet {name}", description=help_)
    module.configure(parser)
    parsed = parser.parse_args(rest)
    try:
        code: int = module.run(parsed)
    except LlmfleetError as exc:
        print(f"llmfleet {name}: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
