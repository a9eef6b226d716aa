"""`llmfleet admin <action>`: bootstrap an installation directly against PostgreSQL.

  migrate                                   apply apps/core/db/migrations/*.sql (idempotent)
  create-team NAME [--credits C]            a team, optionally with starting credits
  create-key --team NAME|--team-id ID [--model M ...] [--rpm N] [--tokens-per-day N] [--max-streams N]
              [--max-tokens N] [--max-context N] [--expires-at ISO]
                                            prints the key once (stored only as an HMAC)
  add-credits --team NAME|--team-id ID --amount C          a credit entry (credits; decimals allowed)
  mint-admin-token --issuer-key FILE [--ttl S] [--subject S]
                                            an admin JWT from the local issuer's key (dev)
  register-node-pool --pool P --location cloud|onprem
                                            store the hash of the pool token in env `node_token`
                                            (admits node ids `P/<instance>`); idempotent, another
                                            token rotates it; a revoked token stays revoked

Env (`AdminSettings`, docs/configuration.md): the database URL, the secret key (create-key,
register-node-pool), the Redis URL and the node token (register-node-pool). Output is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.cli.settings import AdminSettings
from apps.core.db.migrate import migrate_sync
from apps.core.envnames import env_name
from apps.core.errors import InvalidRequest
from apps.core.identity.keys import KeyStore
from apps.core.identity.local_issuer import LocalIssuer
from apps.core.ledger.teams import TeamStore
from apps.core.nodes.store import LOCATIONS, NodeStore, PoolStatus


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("migrate", help="apply database migrations")
    team = sub.add_parser("create-team", help="create a team")
    team.add_argument("name")
    team.add_argument("--credits", default=None, help="starting credits (decimal)")
    key = sub.add_parser("create-key", help="create an API key (printed once)")
    _team_args(key)
    key.add_argument("--model", action="append", default=[], help="allowed model (repeat); none = all")
    key.add_argument("--rpm", type=int)
    key.add_argument("--tokens-per-day", type=int)
    key.add_argument("--max-streams", type=int)
    key.add_argument("--max-tokens", type=int, help="most completion tokens one request may ask for")
    key.add_argument("--max-context", type=int, help="most prompt + completion tokens one request may use")
    key.add_argument("--expires-at", help="ISO-8601")
    key.add_argument("--name")
    credits = sub.add_parser("add-credits", help="add (or with a negative amount, remove) credits")
    _team_args(credits)
    credits.add_argument("--amount", required=True)
    mint = sub.add_parser("mint-admin-token", help="mint an admin JWT with the local issuer key")
    mint.add_argument("--issuer-key", required=True, type=Path)
    mint.add_argument("--ttl", type=int, default=12 * 3600)
    mint.add_argument("--subject", default="admin")
    pool = sub.add_parser(
        "register-node-pool",
        help=f"store a node pool's token (from {env_name(AdminSettings, 'node_token')}), e.g. for EKS pods",
    )
    pool.add_argument("--pool", required=True, help="pool id; members register as <pool>/<instance>")
    pool.add_argument("--location", required=True, choices=LOCATIONS)
    pool.add_argument(
        "--model",
        action="append",
        default=None,
        help="a model the pool's nodes may register (repeat); none = any",
    )


def _team_args(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--team", help="the team's name (an all-digit name is a name too)")
    which.add_argument("--team-id", type=int, help="the team's id")


def _team(args: argparse.Namespace) -> int | str:
    return int(args.team_id) if args.team_id is not None else str(args.team)


def parse_credits(amount: str) -> int:
    try:
        micro = Decimal(amount) * 1_000_000
    except InvalidOperation:
        raise InvalidRequest(f"not a number of credits: {amount!r}", param="amount") from None
    if micro != micro.to_integral_value():
        raise InvalidRequest("at most 6 decimals", param="amount")
    return int(micro)


async def _with_pool(args: argparse.Namespace, env: AdminSettings) -> dict[str, Any]:
    async with AsyncConnectionPool(env.database_url, min_size=1, max_size=2) as pool:
        teams = TeamStore(pool)
        if args.action == "create-team":
            team = await teams.create_team(args.name)
            if args.credits is not None:
                await teams.add_credits(team.id, parse_credits(args.credits), "initial")
                team = await teams.get_team(team.id)
            return team.as_json()
        if args.action == "add-credits":
            return await teams.add_credits(_team(args), parse_credits(args.amount), "cli")
        secret_key = _secret_key(env)
        if args.action == "register-node-pool":
            return await _register_node_pool(args, pool, secret_key, env)
        expires = datetime.fromisoformat(args.expires_at) if args.expires_at else None
        secret, record = await KeyStore(pool, secret_key.encode()).create(
            team=_team(args),
            model_allowlist=args.model,
            rpm=args.rpm,
            tokens_per_day=args.tokens_per_day,
            max_streams=args.max_streams,
            max_tokens=args.max_tokens,
            max_context=args.max_context,
            expires_at=expires,
            name=args.name,
        )
        return {**record.as_json(), "key": secret}


def _secret_key(env: AdminSettings) -> str:
    secret_key = env.secret_key.get_secret_value()
    if not secret_key:
        raise InvalidRequest(
            f"{env_name(AdminSettings, 'secret_key')} must be set (the same as the gateway's)"
        )
    return secret_key


async def _register_node_pool(
    args: argparse.Namespace, pool: AsyncConnectionPool[Any], secret_key: str, env: AdminSettings
) -> dict[str, Any]:
    # From the environment only: a token on the command line would show in `ps` and shell history.
    token = env.node_token.get_secret_value()
    if not token:
        raise InvalidRequest(f"{env_name(AdminSettings, 'node_token')} must be set to the pool's token")
    redis = Redis.from_url(env.redis_url)
    try:
        store = NodeStore(pool, redis, secret_key.encode(), channel_namespace=env.channel_namespace)
        result = await store.register_pool(args.pool, args.location, token, models=args.model)
    finally:
        await redis.aclose()
    if result.status is PoolStatus.REVOKED:
        # Not an error: a deploy Job re-running with the old Secret must not fail the rollout,
        # and must not quietly undo an operator's revoke either.
        print(
            f"node pool {args.pool!r}: this token was revoked and stays revoked; rotate the token to re-enable",
            file=sys.stderr,
        )
    return result.as_json()


def run(args: argparse.Namespace) -> int:
    env = AdminSettings()
    if args.action == "migrate":
        print(json.dumps({"applied": migrate_sync(env.database_url)}))
        return 0
    if args.action == "mint-admin-token":
        issuer = LocalIssuer.load_or_create(args.issuer_key)
        print(issuer.mint(args.subject, admin=True, ttl_s=args.ttl))
        return 0
    print(json.dumps(asyncio.run(_with_pool(args, env))))
    return 0
