"""`llmfleet model canary|promote|rollback|status`: a model's live revisions and the share of its
conversations the canary takes (`apps/core/rollouts.py`; every orchestrator replica reads them within
`canary_refresh_s`).

    llmfleet model canary --model M --revision R --weight 5 [--stable S | --stack dev]
    llmfleet model promote --model M
    llmfleet model rollback --model M [--reason TEXT]
    llmfleet model status --model M [--json]

`canary` above weight 0 and `promote` need the revision's signed, passing evaluation (`llmfleet model
eval`; `--bucket` and the verify key as model-sync's); weight 0 stages a candidate without traffic.
`canary` starts a canary (the model's first needs the stable revision: `--stable`, or the one
`--stack` names) or changes the live canary's weight. `promote` makes the canary the stable revision
(every request goes to it); `rollback` takes it out of traffic. A canary's nodes come from the stack
(`models.<name>.canary.revision`: its own Deployment). Errors are one line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
from typing import Any

from psycopg_pool import AsyncConnectionPool

from apps.core.envnames import env_name
from apps.core.errors import InvalidRequest
from apps.core.rollouts import RolloutStore
from apps.modelsync import eval_cli
from apps.modelsync.settings import ModelSyncSettings

ACTIONS = ("canary", "promote", "rollback", "status")


def configure(actions: Any) -> None:
    """The rollout actions, on `llmfleet model`'s subparsers."""
    env = ModelSyncSettings()
    canary = actions.add_parser("canary", help="send a share of the conversations to a new revision")
    canary.add_argument("--revision", required=True, help="the canary revision (its nodes serve it)")
    canary.add_argument("--weight", type=float, required=True, help="percent of conversations, 0-100")
    stable = canary.add_mutually_exclusive_group()
    stable.add_argument("--stable", help="the stable revision (the model's first rollout only)")
    stable.add_argument("--stack", help="take the stable revision from this stack's spec")
    promote = actions.add_parser("promote", help="the canary becomes the stable revision")
    rollback = actions.add_parser("rollback", help="take the canary out of traffic")
    rollback.add_argument("--reason", help="why (kept in the rollout's history)")
    status = actions.add_parser("status", help="the live revisions, the weight and the history")
    status.add_argument("--json", action="store_true", help="one JSON object")
    for p in (canary, promote):  # the evaluation gate reads the registry (apps/modelsync/evalgate.py)
        eval_cli.store_options(p)
    for p in (canary, promote, rollback, status):
        p.add_argument("--model", required=True, help="model name, e.g. llama-3.1-8b-instruct")
        p.add_argument(
            "--database-url",
            default=env.database_url,
            help=f"the platform's PostgreSQL (env {env_name(ModelSyncSettings, 'database_url')})",
        )
        p.add_argument("--actor", default=getpass.getuser(), help="who the history names (default: you)")


def _stable(args: argparse.Namespace) -> str | None:
    if getattr(args, "stack", None) is None:
        return getattr(args, "stable", None)
    from apps.core.spec import load_spec

    spec = load_spec(args.stack)
    if args.model not in spec.models:
        raise InvalidRequest(f"model {args.model!r} is not in stack {spec.name}", param="model")
    return spec.models[args.model].revision


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.database_url:
        name = env_name(ModelSyncSettings, "database_url")
        raise InvalidRequest(f"no database: --database-url or {name}", param="database_url")
    async with AsyncConnectionPool(args.database_url, min_size=1, max_size=1, open=False) as pool:
        store = RolloutStore(pool)
        if args.action == "canary":
            if args.weight > 0:  # weight 0 stages a candidate (no traffic): it is evaluated there
                eval_cli.gate(args, args.model, args.revision)
            await store.start(args.model, args.revision, args.weight, _stable(args), args.actor)
        elif args.action == "promote":
            live = await store.get(args.model)
            if live is not None and live.canary is not None:
                eval_cli.gate(args, args.model, live.canary)
            await store.promote(args.model, args.actor)
        elif args.action == "rollback" and not await store.rollback(
            args.model, None, args.actor, args.reason
        ):
            raise InvalidRequest(f"model {args.model!r} has no live canary", param="model")
        rollout = await store.get(args.model)
        history = await store.history(args.model)
    return {
        "model": args.model,
        "stable": rollout.stable if rollout else None,
        "canary": rollout.canary if rollout else None,
        "weight_percent": rollout.weight if rollout else 0.0,
        "history": [
            {
                "at": e.at.isoformat(),
                "action": e.action,
                "revision": e.revision,
                "weight_percent": e.weight,
                "actor": e.actor,
                "reason": e.reason,
            }
            for e in history
        ],
    }


def run(args: argparse.Namespace) -> int:
    state = asyncio.run(_run(args))
    if args.action != "status" or args.json:
        print(
            json.dumps(
                state if args.action == "status" else {k: v for k, v in state.items() if k != "history"}
            )
        )
        return 0
    print(f"{state['model']}: stable {state['stable'] or '-'}", end="")
    if state["canary"]:
        print(f", canary {state['canary']} at {state['weight_percent']:g} %", end="")
    print()
    for e in state["history"]:
        why = f" ({e['reason']})" if e["reason"] else ""
        print(f"  {e['at']}  {e['action']:<8} {e['revision']}  by {e['actor']}{why}")
    return 0
