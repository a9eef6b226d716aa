-- Teams, API keys, the two-phase usage ledger and every credit movement.
-- Money is integer microcredits (1 credit = 1,000,000 microcredits).

CREATE TABLE teams (
    id                    BIGSERIAL PRIMARY KEY,
    name                  TEXT NOT NULL UNIQUE,
    balance_microcredits  BIGINT NOT NULL DEFAULT 0 CHECK (balance_microcredits >= 0),
    -- Sum of estimated_cost_microcredits of this team's `reserved` ledger rows, maintained in the
    -- same statement/transaction as every reserve/settle/cancel so admission is one atomic UPDATE.
    reserved_microcredits BIGINT NOT NULL DEFAULT 0 CHECK (reserved_microcredits >= 0),
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id               BIGSERIAL PRIMARY KEY,
    team_id          BIGINT NOT NULL REFERENCES teams(id),
    hash             TEXT NOT NULL UNIQUE,
    prefix           TEXT NOT NULL,
    name             TEXT,
    model_allowlist  TEXT[] NOT NULL DEFAULT '{}',
    rpm              INTEGER CHECK (rpm IS NULL OR rpm > 0),
    tokens_per_day   BIGINT CHECK (tokens_per_day IS NULL OR tokens_per_day > 0),
    max_streams      INTEGER CHECK (max_streams IS NULL OR max_streams > 0),
    expires_at       TIMESTAMPTZ,
    revoked_at       TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX api_keys_team ON api_keys (team_id);

CREATE TYPE usage_status AS ENUM ('reserved', 'settled', 'cancelled');

CREATE TABLE usage_ledger (
    id                           BIGSERIAL PRIMARY KEY,
    request_id                   TEXT NOT NULL UNIQUE,
    team_id                      BIGINT NOT NULL REFERENCES teams(id),
    key_id                       BIGINT REFERENCES api_keys(id),
    model                        TEXT NOT NULL,
    prompt_price_per_million     BIGINT NOT NULL,
    completion_price_per_million BIGINT NOT NULL,
    estimated_cost_microcredits  BIGINT NOT NULL CHECK (estimated_cost_microcredits >= 0),
    prompt_tokens                INTEGER NOT NULL DEFAULT 0,
    completion_tokens            INTEGER NOT NULL DEFAULT 0,
    cost_microcredits            BIGINT NOT NULL DEFAULT 0,
    uncharged_microcredits       BIGINT NOT NULL DEFAULT 0,
    status                       usage_status NOT NULL DEFAULT 'reserved',
    created_at                   TIMESTAMPTZ NOT NULL DEFAULT now(),
    finalized_at                 TIMESTAMPTZ
);
CREATE INDEX usage_ledger_open ON usage_ledger (team_id) WHERE status = 'reserved';
CREATE INDEX usage_ledger_stale ON usage_ledger (created_at) WHERE status = 'reserved';
CREATE INDEX usage_ledger_team_time ON usage_ledger (team_id, created_at);

CREATE TABLE credit_entries (
    id                   BIGSERIAL PRIMARY KEY,
    team_id              BIGINT NOT NULL REFERENCES teams(id),
    amount_microcredits  BIGINT NOT NULL,
    reason               TEXT NOT NULL,
    request_id           TEXT,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX credit_entries_team ON credit_entries (team_id, created_at);
