-- Every replica that may trust its auth caches, by its last heartbeat: a
-- writer's fence waits for each one seen within the trust window, including a
-- replica whose LISTEN connection was just lost (it is no longer listed in
-- pg_stat_activity, yet trusts its caches until it notices).
CREATE TABLE IF NOT EXISTS auth_replicas (
    instance text PRIMARY KEY,
    seen_at timestamptz NOT NULL DEFAULT now()
);
