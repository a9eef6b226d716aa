-- Node control plane: per-node tokens (stored as HMAC hashes) and the node registry.
-- PostgreSQL holds registrations, drain and disconnect events only; heartbeats live in
-- Redis (`node:{id}`, TTL 15 s) so 200 nodes do not cost 40 writes per second here.
-- Idempotent: safe to apply twice.

DO $$ BEGIN
    CREATE TYPE node_location AS ENUM ('cloud', 'onprem');
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Persisted lifecycle of a node's registration (the live state comes from Redis):
-- registered -> draining -> drained, and any of them -> disconnected.
DO $$ BEGIN
    CREATE TYPE node_reg_state AS ENUM ('registered', 'draining', 'drained', 'disconnected');
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

CREATE TABLE IF NOT EXISTS node_tokens (
    node_id     text PRIMARY KEY CHECK (length(node_id) BETWEEN 1 AND 128),
    token_hash  text NOT NULL,
    location    node_location NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE IF NOT EXISTS nodes (
    id               text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    location         node_location NOT NULL,
    gpus             integer NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    models           jsonb NOT NULL DEFAULT '[]'::jsonb,
    last_seen        timestamptz,
    orchestrator_id  text,
    state            node_reg_state NOT NULL DEFAULT 'registered',
    agent_version    text NOT NULL DEFAULT '',
    registered_at    timestamptz NOT NULL DEFAULT now(),
    drained_at       timestamptz
);

-- Append-only audit of registration/drain/disconnect events (a few per node per day).
CREATE TABLE IF NOT EXISTS node_events (
    id               bigserial PRIMARY KEY,
    node_id          text NOT NULL,
    event            text NOT NULL,
    orchestrator_id  text,
    detail           text NOT NULL DEFAULT '',
    at               timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS node_events_node_at ON node_events (node_id, at);
