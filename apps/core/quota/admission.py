"""Per-key and per-team admission in Redis: one Lua script, one round trip (docs/architecture.md D3).

Order (the brief's cheapest first): the key's concurrent streams, the team's concurrent streams,
the key's requests per minute, the key's tokens per day, the team's tokens per minute. A request id that already holds a slot is refused as a duplicate (so a client reusing
`x-request-id` cannot free a running stream's slot). Nothing is written unless every check
passes, so a request refused for rpm does not hold a stream slot and a request refused for
streams does not consume an rpm slot.

Keys:
  streams:{key_id}        SET of active request ids (SCARD = streams in use); expires
                          `lease_s` after the last admission, so a dead gateway's slots go away.
  streams:{key_id}:lease  ZSET request id -> lease deadline (ms); members past their lease are
                          pruned from both, so one crashed gateway cannot pin slots while
                          other replicas keep the set alive.
  rl:{key_id}:rpm         ZSET sliding window of admission times (ms), TTL 60 s.
  tpd:{key_id}:{yyyymmdd} tokens settled today (incremented by `apps.core.metering`).
  tpd:{key_id}:inflight   HASH request id -> "worst-case tokens:lease deadline (ms)" of the
                          requests admitted and not yet settled (only for keys with a
                          `tokens_per_day`). Admission refuses when settled + in flight + this
                          request's worst case exceeds the limit, in the same script; the settle
                          removes the entry in the same script that counts the settled tokens
                          (`apps.core.metering`), a cancel through `release(..., forget_tokens=True)`;
                          an entry past its lease is pruned (a crashed gateway's requests).

  tstreams:{team_id}      the team's SET of active request ids and (`:lease`) its lease ZSET,
                          as the key's, written only for a team with `max_streams`.
  ttpm:{team_id}          HASH second (epoch s) -> tokens admitted in it, for a team with
                          `tokens_per_minute`: a request is admitted while the last 60 s plus its
                          worst case stay within the limit (counted at admission, as the
                          daily budget's in-flight part; fields older than the window are pruned).

`release` removes the request from the stream sets (idempotent).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apps.core.metering import tpd_inflight_key, tpd_key
from apps.core.stores import redis_boundary

WINDOW_MS = 60_000
# The retry hint of a `max_streams` refusal (the key's or the team's): a slot frees the moment any
# of the streams holding one ends, which nothing here can predict (the slot's lease only bounds a
# crashed gateway's slot, at the longest request plus a margin: minutes, not when a slot frees). A
# retry costs one Redis round trip, so the hint is the shortest `Retry-After` there is, 1 s.
STREAM_RETRY_MS = 1_000

RELEASE_LUA = """
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] == '1' then redis.call('HDEL', KEYS[3], ARGV[1]) end
if KEYS[4] then
  redis.call('SREM', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
end
return 1
"""

ADMIT_LUA = """
local streams, lease, rpm_key, tpd, inflight = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local rid = ARGV[1]
local now = tonumber(ARGV[2])
local max_streams = tonumber(ARGV[3])
local rpm = tonumber(ARGV[4])
local tpd_limit = tonumber(ARGV[5])
local lease_ms = tonumber(ARGV[6])
local window = tonumber(ARGV[7])
local worst = tonumber(ARGV[8])
local tstreams, tlease, ttpm = KEYS[6], KEYS[7], KEYS[8]
local team_streams = tonumber(ARGV[9])
local team_tpm = tonumber(ARGV[10])
local stream_retry = tonumber(ARGV[11])

local expired = redis.call('ZRANGEBYSCORE', lease, '-inf', now)
if #expired > 0 then
  redis.call('SREM', streams, unpack(expired))
  redis.call('ZREMRANGEBYSCORE', lease, '-inf', now)
end
if redis.call('SISMEMBER', streams, rid) == 1 then
  return {4, 0, 0, 0, 0, 0, 0, 0}
end
local active = redis.call('SCARD', streams)
if max_streams > 0 and active >= max_streams then
  return {1, active, stream_retry, 0, 0, 0, 0, 0}
end
local team_active = 0
if team_streams > 0 then
  local texpired = redis.call('ZRANGEBYSCORE', tlease, '-inf', now)
  if #texpired > 0 then
    redis.call('SREM', tstreams, unpack(texpired))
    redis.call('ZREMRANGEBYSCORE', tlease, '-inf', now)
  end
  team_active = redis.call('SCARD', tstreams)
  if team_active >= team_streams then
    return {5, team_active, stream_retry, 0, 0, team_active, 0, 0}
  end
end

redis.call('ZREMRANGEBYSCORE', rpm_key, '-inf', now - window)
local used = redis.call('ZCARD', rpm_key)
local oldest = redis.call('ZRANGE', rpm_key, 0, 0, 'WITHSCORES')
local reset = 0
if oldest[2] then reset = tonumber(oldest[2]) + window - now end
if rpm > 0 and used >= rpm then
  return {2, used, math.max(reset, 1), used, 0, 0, 0, 0}
end

local tokens = tonumber(redis.call('GET', tpd) or '0')
if tpd_limit > 0 then
  local entries = redis.call('HGETALL', inflight)
  for i = 1, #entries, 2 do
    local sep = string.find(entries[i + 1], ':', 1, true)
    if sep and tonumber(string.sub(entries[i + 1], sep + 1)) > now then
      tokens = tokens + tonumber(string.sub(entries[i + 1], 1, sep - 1))
    else
      redis.call('HDEL', inflight, entries[i])
    end
  end
  if tokens + math.max(worst, 1) > tpd_limit then
    return {3, tokens, 0, used, tokens, 0, 0, 0}
  end
end
local team_tokens, team_reset = 0, 0
local second = math.floor(now / 1000)
if team_tpm > 0 then
  local buckets = redis.call('HGETALL', ttpm)
  local oldest_sec = second
  for i = 1, #buckets, 2 do
    local sec = tonumber(buckets[i])
    if sec <= second - 60 then
      redis.call('HDEL', ttpm, buckets[i])
    else
      team_tokens = team_tokens + tonumber(buckets[i + 1])
      if sec < oldest_sec then oldest_sec = sec end
    end
  end
  team_reset = (oldest_sec + 60) * 1000 - now
  if team_tokens + math.max(worst, 1) > team_tpm then
    return {6, team_tokens, math.max(team_reset, 1000), used, tokens, team_active, team_tokens, team_reset}
  end
end
if tpd_limit > 0 then
  redis.call('HSET', inflight, rid, worst .. ':' .. (now + lease_ms))
  redis.call('PEXPIRE', inflight, lease_ms)
  tokens = tokens + worst
end
if team_tpm > 0 then
  redis.call('HINCRBY', ttpm, tostring(second), math.max(worst, 1))
  redis.call('PEXPIRE', ttpm, window + 1000)
  team_tokens = team_tokens + math.max(worst, 1)
end
if team_streams > 0 then
  redis.call('SADD', tstreams, rid)
  redis.call('PEXPIRE', tstreams, lease_ms)
  redis.call('ZADD', tlease, now + lease_ms, rid)
  redis.call('PEXPIRE', tlease, lease_ms)
  team_active = team_active + 1
end

redis.call('SADD', streams, rid)
redis.call('PEXPIRE', streams, lease_ms)
redis.call('ZADD', lease, now + lease_ms, rid)
redis.call('PEXPIRE', lease, lease_ms)
redis.call('ZADD', rpm_key, now, rid .. ':' .. now)
redis.call('PEXPIRE', rpm_key, window)
if reset <= 0 then reset = window end
return {0, active + 1, reset, used + 1, tokens, team_active, team_tokens, team_reset}
"""


class Verdict(enum.IntEnum):
    ADMITTED = 0
    MAX_STREAMS = 1
    RPM = 2
    TOKENS_PER_DAY = 3
    DUPLICATE = 4  # the request id holds a stream slot already (a client reusing x-request-id)
    TEAM_MAX_STREAMS = 5
    TEAM_TOKENS_PER_MINUTE = 6


@dataclass(frozen=True)
class TeamLimits:
    """A team's limits on top of its keys' (0 or None: unlimited)."""

    team_id: int
    max_streams: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class Limits:
    """0 or None means unlimited."""

    max_streams: int | None = None
    rpm: int | None = None
    tokens_per_day: int | None = None
    team: TeamLimits | None = None  # checked in the same script


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    limits: Limits
    active_streams: int
    retry_after_s: float
    requests_in_window: int
    rpm_reset_s: float
    tokens_today: int
    tokens_reset_s: float
    team_active_streams: int = 0
    team_tokens_in_window: int = 0
    team_tokens_reset_s: float = 60.0

    @property
    def admitted(self) -> bool:
        return self.verdict is Verdict.ADMITTED

    def remaining_requests(self) -> int | None:
        return None if not self.limits.rpm else max(self.limits.rpm - self.requests_in_window, 0)

    def remaining_tokens(self) -> int | None:
        return (
            None if not self.limits.tokens_per_day else max(self.limits.tokens_per_day - self.tokens_today, 0)
        )

    def remaining_team_tokens(self) -> int | None:
        team = self.limits.team
        if team is None or not team.tokens_per_minute:
            return None
        return max(team.tokens_per_minute - self.team_tokens_in_window, 0)


def seconds_to_utc_midnight(now: datetime) -> float:
    now = now.astimezone(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return (midnight - now).total_seconds()


class QuotaStore:
    """The Redis side of admission; `redis` is a `redis.asyncio.Redis`."""

    def __init__(self, redis: Any, *, lease_s: float) -> None:
        """`lease_s`: the stream slot's lease, the longest request plus a margin
        (`GatewaySettings.stream_lease_s`)."""
        self._redis = redis
        self._lease_ms = int(lease_s * 1000)
        self._script = redis.register_script(ADMIT_LUA)
        self._release = redis.register_script(RELEASE_LUA)

    @redis_boundary
    async def admit(
        self, subject: str, request_id: str, limits: Limits, now: datetime, worst_case_tokens: int = 0
    ) -> Admission:
        """`worst_case_tokens`: what the request may use at most (prompt bound + n x max_tokens)."""
        now_ms = int(now.timestamp() * 1000)
        team = limits.team
        tkey = team.team_id if team is not None else 0
        keys = [
            f"streams:{subject}",
            f"streams:{subject}:lease",
            f"rl:{subject}:rpm",
            tpd_key(subject, now),
            tpd_inflight_key(subject),
            f"tstreams:{tkey}",
            f"tstreams:{tkey}:lease",
            f"ttpm:{tkey}",
        ]
        args = [
            request_id,
            now_ms,
            limits.max_streams or 0,
            limits.rpm or 0,
            limits.tokens_per_day or 0,
            self._lease_ms,
            WINDOW_MS,
            max(worst_case_tokens, 0),
            (team.max_streams or 0) if team is not None else 0,
            (team.tokens_per_minute or 0) if team is not None else 0,
            STREAM_RETRY_MS,
        ]
        raw = await self._script(keys=keys, args=args)
        code, a, retry_ms, used, tokens, team_active, team_tokens, team_reset_ms = (int(x) for x in raw)
        verdict = Verdict(code)
        reset_tokens = seconds_to_utc_midnight(now)
        if verdict is Verdict.TOKENS_PER_DAY:
            retry_s = reset_tokens
        else:
            retry_s = retry_ms / 1000 if verdict is not Verdict.ADMITTED else 0.0
        return Admission(
            verdict=verdict,
            limits=limits,
            active_streams=a
            if verdict not in (Verdict.TOKENS_PER_DAY, Verdict.TEAM_TOKENS_PER_MINUTE)
            else 0,
            retry_after_s=retry_s,
            requests_in_window=used,
            rpm_reset_s=(retry_ms / 1000) if verdict in (Verdict.ADMITTED, Verdict.RPM) else 60.0,
            tokens_today=tokens,
            tokens_reset_s=reset_tokens,
            team_active_streams=team_active,
            team_tokens_in_window=team_tokens,
            team_tokens_reset_s=team_reset_ms / 1000 if team_reset_ms > 0 else 60.0,
        )

    @redis_boundary
    async def release(
        self, subject: str, request_id: str, *, forget_tokens: bool = False, team_id: int | None = None
    ) -> None:
        """Free the stream slot (and the team's); with `forget_tokens` (nothing ran: no settle will
        come) also the request's in-flight tokens."""
        # One script (atomic like MULTI/EXEC, but one command and one reply): measured, a
        # redis-py transaction pipeline cost the gateway about twice the admission's CPU.
        keys = [f"streams:{subject}", f"streams:{subject}:lease", tpd_inflight_key(subject)]
        if team_id is not None:
            keys += [f"tstreams:{team_id}", f"tstreams:{team_id}:lease"]
        await self._release(keys=keys, args=[request_id, "1" if forget_tokens else "0"])

    async def active_streams(self, subject: str) -> int:
        return int(await self._redis.scard(f"streams:{subject}"))
