-- Usage per credential (issue 24): tool calls per hour by credential, tool,
-- library-count bucket and outcome, added to in batches by every replica.
CREATE TABLE usage_hourly (
    hour       TIMESTAMPTZ NOT NULL,
    -- token:<id>, team:<uuid>, or a per-turn JWT's sub (never a secret)
    credential VARCHAR(200) NOT NULL,
    kind       VARCHAR(16) NOT NULL,
    tool       VARCHAR(64) NOT NULL,
    libraries  VARCHAR(16) NOT NULL,
    outcome    VARCHAR(32) NOT NULL,
    calls      BIGINT NOT NULL CHECK (calls >= 0),
    PRIMARY KEY (hour, kind, credential, tool, libraries, outcome)
);
CREATE INDEX usage_hourly_kind_hour_idx ON usage_hourly (kind, hour);
