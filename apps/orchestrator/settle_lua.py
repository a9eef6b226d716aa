"""The settle step's Redis scripts (`settle.py` runs them): one atomic round trip per report.

`RECORD_DONE_LUA` frees the node's slot, refuses a report that is not the node's, caps it at the
request's budget and at what the node relayed, and writes the done record the sweeper settles from.
`ADD_RELAYED_LUA` keeps a closing socket's relayed counts for the report that comes on the next one.
"""

from __future__ import annotations

# One round trip instead of three (ZREM, HGET, then SET): free the node's slot, then refuse a
# report for a request that is not this node's: never assigned to anyone (`req:{id}` absent: a
# request still queued, or one this node never got) or assigned to another node (`req:{id}`.node
# names the node it was retried or resumed on). Only then write the done record the sweeper reads.
# The assignment's budget comes back with it (the fields `Budget.to_fields` wrote, apps/core/budget.py):
# the report is capped at it before the done record is written, by `Budget.clamp`'s rule (the
# script must cap atomically; tests/integration/test_budget_lua.py holds the two together). The completion reported is also
# held against the content events the node relayed (`relayed`: this socket's count in ARGV[6],
# '' when this socket did not carry the request, plus what earlier sockets of the node counted,
# flushed into `req:{id}`.relayed when they closed): beyond `events x ARGV[7] + ARGV[8]` the
# lower count (the events) is settled; the node is flagged for it only when this socket carried
# the request (a report checked against closed sockets' counts alone is capped, not a finding).
# Returns {recorded, slot freed, capped, prompt, completion, platform, unrelayed, relayed events,
# and when recorded (1) the model revision the assignment went to ('' not known)};
# recorded: 1 recorded, 0 the assignment moved to another node, 2 deferred to the relay (below),
# 3 not this node's (never assigned), 4 sent on the assignment's socket before the assignment.
# ARGV[9]: the report's socket (`conn`, '' unknown); `req:{id}`.conn is the socket `acquire_slot`
# assigned it on (the node's registered one then).
RECORD_DONE_LUA = """
local req = redis.call('HMGET', KEYS[1], 'node', 'max_prompt', 'max_completion', 'resumable',
                       'resume_delivered', 'resume_prompt', 'relayed', 'conn', 'revision')
if req[1] == ARGV[1] and ARGV[6] == '' and not req[7] and ARGV[9] ~= '' and req[8] == ARGV[9] then
  -- Assigned on this very socket, which had no assignment for it when the report came, and no
  -- earlier socket of the node carried it: the report was sent before the assignment reached the
  -- socket (a hostile node reporting a queued request). Not for it: nothing recorded, and the
  -- slot of the real assignment stays taken.
  return {4, 0, 0, 0, 0, 0, 0, -1}
end
local freed = redis.call('ZREM', KEYS[3], ARGV[4])
if not req[1] then return {3, freed, 0, 0, 0, 0, 0, -1} end
if req[1] ~= ARGV[1] then return {0, freed, 0, 0, 0, 0, 0, -1} end
local record = cjson.decode(ARGV[2])
if req[9] then record.revision = req[9] end  -- the audit trail: the revision the assignment went to
record.prompt_tokens = tonumber(record.prompt_tokens) or 0
record.completion_tokens = tonumber(record.completion_tokens) or 0
local unrelayed = 0
local relayed = -1
if ARGV[6] ~= '' or req[7] then
  relayed = tonumber(req[7] or '0') + tonumber(ARGV[6] ~= '' and ARGV[6] or '0')
  -- Kept: a second report for the request on this socket (a node reports once; only a hostile
  -- one reports again, after this socket's count is gone) is held against the same count.
  if ARGV[6] ~= '' then redis.call('HINCRBY', KEYS[1], 'relayed', ARGV[6]) end
  local reported = tonumber(record.completion_tokens)
  if reported > relayed * tonumber(ARGV[7]) + tonumber(ARGV[8]) then
    record.completion_tokens = math.min(reported, relayed)
    -- 1: this socket carried the request and relayed too little (the node's report disagrees with
    -- its own relay); 2: only sockets that closed before the report carried it (what the node wrote
    -- into a dying socket, and what its engine made before the abort, never arrived: no finding).
    unrelayed = ARGV[6] ~= '' and 1 or 2
  end
end
local platform = 0
if req[5] then
  -- The second node of a resumed stream (apps/orchestrator/resume.py `billed`): the team pays its
  -- prompt once and every completion token it received; this node's prompt is platform cost.
  platform = tonumber(record.prompt_tokens)
  if req[6] and req[6] ~= '' then
    record.prompt_tokens = tonumber(req[6])
  else
    record.prompt_tokens = math.max(0, platform - tonumber(req[5]))
  end
  record.completion_tokens = tonumber(record.completion_tokens) + tonumber(req[5])
  record.resume_prompt_tokens = platform
elseif req[4] == '1' and ARGV[5] == '1' then
  -- The first node's mid-stream error of a stream that may resume: the relay resumes it (the
  -- second node settles) or settles this report itself; the record is the sweeper's fallback.
  redis.call('SET', KEYS[2], cjson.encode(record), 'EX', ARGV[3])
  return {2, freed, 0, 0, 0, 0, unrelayed, relayed}
end
local capped = 0
if req[2] and tonumber(record.prompt_tokens) > tonumber(req[2]) then
  record.prompt_tokens = tonumber(req[2]); capped = 1
end
if req[3] and tonumber(record.completion_tokens) > tonumber(req[3]) then
  record.completion_tokens = tonumber(req[3]); capped = 1
end
redis.call('SET', KEYS[2], cjson.encode(record), 'EX', ARGV[3])
return {1, freed, capped, record.prompt_tokens, record.completion_tokens, platform, unrelayed, relayed,
        req[9] or ''}
"""

# A node socket closed with requests it carried still unreported: add the content events it relayed
# for each to `req:{id}`.relayed, so the report that comes later on another socket (the agent's
# journal replay) is held against them. Only while the request is still this node's.
# KEYS: req hashes. ARGV: node_id, then one count per key.
ADD_RELAYED_LUA = """
for i, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'node') == ARGV[1] then
    redis.call('HINCRBY', key, 'relayed', ARGV[i + 1])
  end
end
return 1
"""
