-- A user's ceiling (issue 32): the tools and the request rate that every
-- opaque token of the user has at most, however it was minted. NULL = no
-- ceiling (every tool; the token's own or the configured rate). A token's
-- own allowlist and rate only narrow it. `users_notify` already announces
-- every update of `users`, so a lowered ceiling reaches every replica's
-- next request.
ALTER TABLE users ADD COLUMN max_tools TEXT[];
ALTER TABLE users ADD COLUMN max_rate_per_minute INTEGER CHECK (max_rate_per_minute >= 1);
