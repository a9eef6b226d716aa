"""`llmfleet enginesim`: run the vLLM-compatible engine simulator as a process."""

from __future__ import annotations

import argparse
import asyncio

from apps.core.errors import SpecError
from apps.enginesim.faults import Faults
from apps.enginesim.kvevents import KvEventsError
from apps.enginesim.profiles import known_profiles
from apps.enginesim.server import run_enginesim, setup_logging
from apps.enginesim.settings import EngineSimSettings, KvEventsConfig


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="served model name (what clients send as `model`); required to serve")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--profile",
        help="engine profile (default: the model name if it is one, else `tiny`); see --list-profiles",
    )
    parser.add_argument("--stack", default="prod", help="stack spec the catalog profiles come from")
    parser.add_argument("--speed", type=float, default=1.0, help="time scale: 10 runs ten times faster")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument(
        "--scheduling-policy", choices=("fcfs", "priority"), default="fcfs", help="as vLLM's (default fcfs)"
    )
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--num-blocks", type=int, help="override the KV-block budget of the profile")
    parser.add_argument("--max-num-batched-tokens", type=int, help="as vLLM's: the token budget of one step")
    parser.add_argument(
        "--timing-log",
        metavar="PATH",
        help="append per streamed request {user, arrived, first_content} (monotonic s) as JSON lines",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="as vLLM's (default on): full prompt blocks are cached and shared between requests",
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="as vLLM's: usage carries prompt_tokens_details (cached_tokens, created_cache_tokens)",
    )
    parser.add_argument(
        "--dev-mode",
        action="store_true",
        help="serve vLLM's dev-mode routes POST /pause, POST /resume, GET /is_paused (VLLM_SERVER_DEV_MODE=1)",
    )
    _runner_flags(parser)
    parser.add_argument(
        "--kv-events-config",
        metavar="JSON",
        help="as vLLM's: publish KV cache events over ZMQ, e.g. "
        '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": "kv"}\'',
    )
    faults = parser.add_argument_group("fault injection (also at run time: POST /_sim/faults)")
    faults.add_argument("--loading-s", type=float, default=0.0, help="refuse connections for T s at start")
    faults.add_argument("--die-after-tokens", type=int, help="drop each stream's connection after K tokens")
    faults.add_argument("--stall-s", type=float, help="each stream stops producing for T s ...")
    faults.add_argument("--stall-after-tokens", type=int, default=0, help="... after K tokens (default 0)")
    faults.add_argument("--error-after-tokens", type=int, help="in-stream error event after K tokens")
    faults.add_argument("--fail-status", type=int, help="answer every chat request with this HTTP status")
    faults.add_argument("--list-profiles", action="store_true", help="print the known profiles and exit")


def _runner_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runner",
        choices=("generate", "pooling"),
        default="generate",
        help="as vLLM's: generate serves chat and completions; pooling serves /v1/embeddings",
    )
    parser.add_argument(
        "--embedding-dim",
        type=int,
        default=1024,
        metavar="N",
        help="a pooling engine's embedding length (vLLM: the model's hidden size; default 1024)",
    )


def run(args: argparse.Namespace) -> int:
    if args.list_profiles:
        for name, prof in sorted(known_profiles(args.stack).items()):
            print(
                f"{name:<28} blocks={prof.num_blocks:<6} max_num_seqs={prof.max_num_seqs:<4} "
                f"max_model_len={prof.max_model_len:<6} "
                f"{prof.decode_tokens_per_s_per_stream(1):.0f} tok/s at batch 1"
            )
        return 0
    if not args.model:
        raise SpecError(
            "--model is required (the served model name); --list-profiles shows the profiles", param="model"
        )
    if args.speed <= 0:
        raise SpecError(f"--speed must be greater than 0, got {args.speed}", param="speed")
    settings = _settings(args)
    setup_logging()
    try:
        asyncio.run(run_enginesim(settings))
    except KvEventsError as exc:
        raise SpecError(str(exc), param="kv_events_config") from None
    except OSError as exc:
        raise SpecError(
            f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", param="port"
        ) from None
    return 0


def _settings(args: argparse.Namespace) -> EngineSimSettings:
    """The flags as settings, or a `SpecError` naming the bad one."""
    if args.embedding_dim < 1:
        raise SpecError(
            f"--embedding-dim must be at least 1, got {args.embedding_dim}", param="embedding_dim"
        )
    try:
        faults = Faults(
            die_after_tokens=args.die_after_tokens,
            stall_s=args.stall_s,
            stall_after_tokens=args.stall_after_tokens,
            error_after_tokens=args.error_after_tokens,
            fail_status=args.fail_status,
        )
    except ValueError as exc:
        raise SpecError(f"invalid fault flags: {exc}", param="faults") from None
    try:
        kv_events = KvEventsConfig.model_validate_json(args.kv_events_config or "{}")
    except ValueError as exc:
        raise SpecError(f"invalid --kv-events-config: {exc}", param="kv_events_config") from None
    return EngineSimSettings(
        model=args.model,
        profile=args.profile,
        host=args.host,
        port=args.port,
        speed=args.speed,
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        scheduling_policy=args.scheduling_policy,
        max_model_len=args.max_model_len,
        num_blocks=args.num_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        stack=args.stack,
        loading_s=args.loading_s,
        faults=faults,
        timing_log=args.timing_log,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        dev_mode=args.dev_mode,
        kv_events_config=kv_events,
        runner=args.runner,
        embedding_dim=args.embedding_dim,
    )
