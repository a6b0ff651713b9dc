//! Auth caches: one moka cache per question, each invalidated by the Postgres
//! `LISTEN mnemosyne_auth` task (`listen`) and bounded by the configured maximum
//! staleness. While the listener is down the caches are bypassed, and on every
//! (re)connect they are emptied: a gap in notifications means "cold".

use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};
use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::PgPool;
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::ids::Scope;
use crate::store::pg::index_changes::KnownSequences;
use crate::store::pg::{auth::TeamAuthRow, auth::TokenAuthRow, AUTH_CHANNEL, INDEX_CHANNEL};

/// A moka cache with a generation counter: a value read from a store is only
/// inserted if no invalidation happened since the read began, so a NOTIFY that
/// races a slow read cannot be overwritten by the stale value.
pub struct Named<K, V> {
    cache: Cache<K, V>,
    generation: AtomicU64,
    /// `auth_cache_requests_total{cache=<name>, result=hit|miss|bypassed}`.
    hit: IntCounter,
    miss: IntCounter,
    bypassed: IntCounter,
}

/// Counts every cache answer; registered by `Metrics`.
pub fn cache_requests() -> IntCounterVec {
    IntCounterVec::new(
        Opts::new(
            "auth_cache_requests_total",
            "Auth cache lookups by cache and result (hit, miss, bypassed)",
        ),
        &["cache", "result"],
    )
    .expect("valid metric")
}

impl<K, V> Named<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    fn new(name: &str, ttl: Duration, capacity: u64, requests: &IntCounterVec) -> Self {
        Named {
            cache: Cache::builder()
                .name(name)
                .max_capacity(capacity)
                .time_to_live(ttl)
                .build(),
            generation: AtomicU64::new(0),
            hit: requests.with_label_values(&[name, "hit"]),
            miss: requests.with_label_values(&[name, "miss"]),
            bypassed: requests.with_label_values(&[name, "bypassed"]),
        }
    }

    /// The read-through sequence, written once: when the caches are `usable`
    /// a cached value answers; otherwise `load` runs, and its value is cached
    /// unless an invalidation raced the load (the generation moved). Errors
    /// are never cached.
    pub async fn read_through<E, F, Fut>(&self, usable: bool, key: K, load: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let generation = self.generation();
        if !usable {
            self.bypassed.inc();
            return load().await;
        }
        if let Some(v) = self.cache.get(&key).await {
            self.hit.inc();
            return Ok(v);
        }
        self.miss.inc();
        let v = load().await?;
        self.insert_if_current(generation, key, v.clone()).await;
        Ok(v)
    }

    /// `read_through`, where a cached value answers only when `valid` says
    /// it still applies (else it is loaded again, as a miss).
    pub async fn read_through_valid<E, F, Fut>(
        &self,
        usable: bool,
        key: K,
        valid: impl FnOnce(&V) -> bool,
        load: F,
    ) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let generation = self.generation();
        if !usable {
            self.bypassed.inc();
            return load().await;
        }
        if let Some(v) = self.cache.get(&key).await {
            if valid(&v) {
                self.hit.inc();
                return Ok(v);
            }
        }
        self.miss.inc();
        let v = load().await?;
        self.insert_if_current(generation, key, v.clone()).await;
        Ok(v)
    }

    /// The read-through of several keys at once: cached values are taken,
    /// and the missing keys loaded with one call of `load` (a key it does not
    /// return gets `V::default()`), cached unless an invalidation raced it.
    /// Values come back in `keys` order.
    pub async fn read_through_many<E, F, Fut>(&self, usable: bool, keys: &[K], load: F) -> Result<Vec<V>, E>
    where
        K: Clone,
        V: Default,
        F: FnOnce(Vec<K>) -> Fut,
        Fut: Future<Output = Result<std::collections::HashMap<K, V>, E>>,
    {
        let generation = self.generation();
        let mut values: Vec<Option<V>> = Vec::with_capacity(keys.len());
        for k in keys {
            values.push(self.lookup(usable, k).await);
        }
        let missing: Vec<K> = keys
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        if !missing.is_empty() {
            let mut fetched = load(missing).await?;
            for (slot, k) in values.iter_mut().zip(keys) {
                if slot.is_none() {
                    let v = fetched.remove(k).unwrap_or_default();
                    if usable {
                        self.insert_if_current(generation, k.clone(), v.clone()).await;
                    }
                    *slot = Some(v);
                }
            }
        }
        Ok(values.into_iter().flatten().collect())
    }

    /// A lookup without a load, counted.
    pub async fn lookup(&self, usable: bool, k: &K) -> Option<V> {
        if !usable {
            self.bypassed.inc();
            return None;
        }
        let v = self.cache.get(k).await;
        if v.is_some() {
            self.hit.inc()
        } else {
            self.miss.inc()
        }
        v
    }

    /// Moves on every invalidation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    pub async fn get(&self, k: &K) -> Option<V> {
        self.cache.get(k).await
    }

    /// Inserts unless an invalidation happened after `generation` was read.
    async fn insert_if_current(&self, generation: u64, k: K, v: V) {
        if self.generation() == generation {
            self.cache.insert(k, v).await;
            // An invalidation may have landed between the check and the insert.
            if self.generation() != generation {
                self.cache.invalidate_all();
            }
        }
    }

    pub async fn invalidate(&self, k: &K) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.cache.invalidate(k).await;
    }

    pub fn invalidate_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.cache.invalidate_all();
    }
}

impl<K> Named<K, ()>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// A negative cache: `Ok(None)` straight away when `key` was not found
    /// before; otherwise `load`, and a `None` it returns is remembered unless
    /// an invalidation raced it.
    pub async fn remember_absent<T, E, F, Fut>(&self, usable: bool, key: K, load: F) -> Result<Option<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<T>, E>>,
    {
        if self.lookup(usable, &key).await.is_some() {
            return Ok(None);
        }
        let generation = self.generation();
        let found = load().await?;
        if found.is_none() && usable {
            self.insert_if_current(generation, key, ()).await;
        }
        Ok(found)
    }
}

impl Named<String, Arc<String>> {
    /// Caches an immutable fact (a jti's session binding never changes).
    pub async fn cache_fact(&self, k: String, v: &str) {
        self.cache.insert(k, Arc::new(v.to_owned())).await;
    }
}

/// A team's resolved list and the team row it was computed from (see
/// `AuthCaches::team_libraries`).
#[derive(Clone)]
pub struct TeamScope {
    pub row: Arc<TeamAuthRow>,
    pub scope: Scope,
}

/// Every auth cache of one server instance.
pub struct AuthCaches {
    enabled: bool,
    listener_up: AtomicBool,
    /// This LISTEN connection has heard its own heartbeat at least once. The
    /// heartbeat statement also registers the replica in `auth_replicas`, so
    /// from then on every writer's fence counts it even when its listener
    /// drops out of `pg_stat_activity`; before it, it must not trust caches.
    echoed: AtomicBool,
    /// Wakes the heartbeat as soon as a LISTEN connection is made (the
    /// caches wait for its echo).
    connected: tokio::sync::Notify,
    /// When this instance last heard its own heartbeat on the auth channel
    /// (ms since `started`): a listener that is connected but hears nothing
    /// (a blocked connection) is not trusted past `LISTENER_TRUST`.
    last_echo_ms: AtomicU64,
    started: Instant,
    /// LISTEN connections made so far (each one started from empty caches).
    connections: AtomicU64,
    /// kid → decoded secret of a non-retired key. Invalidated by `mcp_signing_keys:*`.
    pub keys: Named<String, Arc<Vec<u8>>>,
    /// token hash → token row (with its user's member libraries). Invalidated
    /// by `mcp_tokens:*`, `library_memberships:*` and `users:*`.
    pub tokens: Named<String, Arc<TokenAuthRow>>,
    /// team id → team row with assignments. Invalidated by `teams:<id>`,
    /// `team_workspace_assignments:<id>`.
    pub teams: Named<Uuid, Arc<TeamAuthRow>>,
    /// workspace id → its Library uids. Invalidated by `workspace:<id>` (ingest
    /// creating or deleting a workspace Library).
    pub workspace_libraries: Named<String, Arc<Vec<String>>>,
    /// team id → the whole resolved list of a team granted libraries
    /// directly (its workspaces' libraries, then its direct grants the graph
    /// holds), with the team row it was computed from: an answer is used only
    /// while `teams` still holds that very row (`Arc::ptr_eq`), so any team
    /// change (which replaces the row) recomputes it. Emptied by `library:*`
    /// (a user-managed library created, renamed or deleted) and
    /// `workspace:*` (a workspace library created or deleted). Workspace-only
    /// teams do not use it.
    pub team_libraries: Named<Uuid, TeamScope>,
    /// sha256(user:password) → verified service account. Invalidated by `users:*`.
    pub basic: Named<String, Arc<String>>,
    /// Credentials looked up and not found: `tok:<hash>` and `kid:<kid>`, so a
    /// flood of made-up tokens or kids costs no store round trip each.
    /// Invalidated by `mcp_tokens:*` (inserts included) and `mcp_signing_keys:*`.
    pub unknown: Named<String, ()>,
    /// per-turn jti → the session it is bound to (only immutable facts are cached).
    pub jti_sessions: Named<String, Arc<String>>,
    /// The libraries' index sequences heard on `INDEX_CHANNEL`: searches use
    /// them instead of a read while `usable` (forgotten with the caches).
    pub index: Arc<KnownSequences>,
    notifications: broadcast::Sender<String>,
    /// This instance's identity on the auth channel (fences and acks).
    pub instance: Uuid,
    /// Replicas seen alive (this one included, at least 1), counted with
    /// each heartbeat: the rate limits divide their rates by it.
    live_replicas: Arc<AtomicUsize>,
    requests: IntCounterVec,
    listener_connected: IntGauge,
    listener_reconnects: IntCounter,
}

/// `application_name` prefix of every instance's LISTEN connection: a writer
/// finds the live replicas in `pg_stat_activity` by it.
pub const LISTENER_APP: &str = "mnemosyne-listener:";

impl AuthCaches {
    pub fn new(max_staleness: Duration) -> Self {
        let ttl = if max_staleness.is_zero() {
            Duration::from_secs(1)
        } else {
            max_staleness
        };
        let (notifications, _) = broadcast::channel(1024);
        let requests = cache_requests();
        let listener_connected = IntGauge::new(
            "auth_listener_connected",
            "1 while this replica's LISTEN connection is connected and hears its own heartbeat",
        )
        .expect("valid metric");
        let listener_reconnects = IntCounter::new(
            "auth_listener_reconnects_total",
            "LISTEN connections made after the first",
        )
        .expect("valid metric");
        AuthCaches {
            enabled: !max_staleness.is_zero(),
            listener_up: AtomicBool::new(false),
            echoed: AtomicBool::new(false),
            connected: tokio::sync::Notify::new(),
            last_echo_ms: AtomicU64::new(0),
            started: Instant::now(),
            connections: AtomicU64::new(0),
            keys: Named::new("keys", ttl, 1_000, &requests),
            tokens: Named::new("tokens", ttl, 100_000, &requests),
            teams: Named::new("teams", ttl, 100_000, &requests),
            workspace_libraries: Named::new("workspace_libraries", ttl, 100_000, &requests),
            team_libraries: Named::new("team_libraries", ttl, 100_000, &requests),
            basic: Named::new("basic", ttl, 1_000, &requests),
            unknown: Named::new("unknown", ttl, 100_000, &requests),
            // A jti outlives its token by at most the leeway; sessions do not move.
            jti_sessions: Named::new("jti_sessions", Duration::from_secs(11 * 60), 100_000, &requests),
            index: Arc::default(),
            notifications,
            instance: Uuid::new_v4(),
            live_replicas: Arc::new(AtomicUsize::new(1)),
            requests,
            listener_connected,
            listener_reconnects,
        }
    }

    /// This cache set's metrics, for the app's registry.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.listener_connected.clone()),
            Box::new(self.listener_reconnects.clone()),
        ]
    }

    /// Refreshes `auth_listener_connected` (at scrape time).
    pub fn observe(&self) {
        self.listener_connected.set(i64::from(self.usable()));
    }

    /// Whether cached answers may be used right now: caches on, the listener
    /// connected, its own heartbeat heard on this connection (so the replica
    /// is registered for writers' fences), and heard within `LISTENER_TRUST`.
    pub fn usable(&self) -> bool {
        self.enabled
            && self.listener_up.load(Ordering::SeqCst)
            && self.echoed.load(Ordering::SeqCst)
            && self.echo_fresh()
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn echo_fresh(&self) -> bool {
        self.now_ms().saturating_sub(self.last_echo_ms.load(Ordering::SeqCst)) <= LISTENER_TRUST.as_millis() as u64
    }

    /// Our own heartbeat, sent at `sent_ms`, came back through the listener:
    /// everything committed before it has been applied. Freshness is counted
    /// from when it was *sent*, so a listener that runs behind (a backlog, a
    /// starved CPU) is not trusted either. If it had gone quiet for longer
    /// than the trust window, whatever is cached may have missed a
    /// notification: start from empty.
    fn heard_echo(&self, sent_ms: u64) {
        if !self.echo_fresh() || !self.echoed.load(Ordering::SeqCst) {
            self.invalidate_all();
        }
        self.last_echo_ms.fetch_max(sent_ms, Ordering::SeqCst);
        self.echoed.store(true, Ordering::SeqCst);
    }

    /// The heartbeat payload of this instance, stamped with its send time.
    fn ping(&self) -> String {
        format!("ping:{}:{}", self.instance, self.now_ms())
    }

    pub fn invalidate_all(&self) {
        self.index.forget_all();
        self.keys.invalidate_all();
        self.tokens.invalidate_all();
        self.teams.invalidate_all();
        self.workspace_libraries.invalidate_all();
        self.team_libraries.invalidate_all();
        self.basic.invalidate_all();
        self.unknown.invalidate_all();
    }

    /// Applies one `mnemosyne_auth` payload (`<table>:<key>`).
    pub async fn apply(&self, payload: &str) {
        let (table, key) = payload.split_once(':').unwrap_or((payload, "*"));
        match table {
            // Heartbeats: ours proves the listener alive; nothing to invalidate.
            "ping" => {
                if let Some((instance, sent)) = key.split_once(':') {
                    if instance == self.instance.to_string() {
                        if let Ok(sent_ms) = sent.parse() {
                            self.heard_echo(sent_ms);
                        }
                    }
                }
                return;
            }
            // Fence protocol messages: nothing to invalidate.
            "fence" | "ack" => {}
            // A new team row makes its `team_libraries` answer unusable (the
            // row pointer no longer matches); it is dropped too, for memory.
            "teams" | "team_workspace_assignments" | "team_library_grants" => match Uuid::parse_str(key) {
                Ok(id) => {
                    self.teams.invalidate(&id).await;
                    self.team_libraries.invalidate(&id).await;
                }
                Err(_) => {
                    self.teams.invalidate_all();
                    self.team_libraries.invalidate_all();
                }
            },
            "mcp_tokens" => {
                self.tokens.invalidate_all();
                self.unknown.invalidate_all();
            }
            "library_memberships" => self.tokens.invalidate_all(),
            "users" => {
                self.tokens.invalidate_all();
                self.basic.invalidate_all();
            }
            "mcp_signing_keys" => {
                self.keys.invalidate_all();
                self.unknown.invalidate_all();
            }
            "workspace" if key != "*" => {
                self.workspace_libraries.invalidate(&key.to_owned()).await;
                // Its library may be granted to a team directly.
                self.team_libraries.invalidate_all();
            }
            // A user-managed library was created, renamed or deleted: a
            // delete's grants came with payloads of their own; the graph's
            // caches of it listen for this (`forget_changed_libraries`).
            // Which direct team grants exist may have changed.
            "library" if key != "*" => self.team_libraries.invalidate_all(),
            // An MCP session ended (DELETE): the session manager closes its
            // copy (`OwnedSessions::follow`); no auth fact changed.
            "mcp_session" => {}
            _ => self.invalidate_all(),
        }
        let _ = self.notifications.send(payload.to_owned());
    }

    /// Subscribes to applied notifications (a writer waits for its own echo so
    /// that it answers only once the caches have seen the change).
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.notifications.subscribe()
    }

    /// The live replica count, shared (the rate limits read it per request).
    pub fn live_replicas(&self) -> Arc<AtomicUsize> {
        self.live_replicas.clone()
    }

    pub fn listener_up(&self) -> bool {
        self.listener_up.load(Ordering::SeqCst)
    }

    /// How many LISTEN connections this instance has made.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

/// How long a listener may go without hearing its own heartbeat before its
/// replica stops trusting its caches.
pub const LISTENER_TRUST: Duration = Duration::from_secs(2);
/// How often each replica sends its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);
/// A replica counts as live for the rate limits while its heartbeat was seen
/// this recently: long enough that a late heartbeat (a loaded machine) does
/// not make the count, and so every bucket, flap; a replica that is gone
/// keeps the others at its share for this long (stricter, never looser).
pub const REPLICA_WINDOW: Duration = Duration::from_secs(10);
/// Heartbeats between two prunes of long-gone replicas' registrations.
const PRUNE_EVERY_TICKS: u64 = 7_200;
/// Longest a writer waits for the replicas' acknowledgements: past it, a
/// replica that did not answer has stopped trusting its caches (its own
/// heartbeat, sent before the fence, did not come back within `LISTENER_TRUST`).
pub const FENCE_WAIT: Duration = Duration::from_millis(2_500);

/// A fence that not every live replica acknowledged in time. The change is
/// committed, and those replicas bypass their caches, but it could not be
/// confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unconfirmed {
    /// Replicas (or 0 when they could not even be listed) that did not answer.
    pub replicas: usize,
}

impl AuthCaches {
    /// Makes a committed auth change visible on the next request of every
    /// replica: sends `fence:<id>` on the auth channel after the change (so
    /// every listener receives it after the change's own notifications, in
    /// commit order) and waits, bounded by `FENCE_WAIT`, until each live
    /// listener (found by its `application_name`) answered `ack:<id>:<instance>`.
    /// `Err` when that could not be confirmed (see `Unconfirmed`).
    pub async fn fence(&self, pool: &PgPool) -> Result<(), Unconfirmed> {
        let id = Uuid::new_v4();
        let mut rx = self.subscribe();
        // Every replica that may trust its caches: those listening now, and
        // those whose heartbeat was sent within the trust window (plus a
        // margin) — a replica whose listener was just lost is no longer in
        // `pg_stat_activity` but trusts its caches until it notices or its
        // trust lapses, so it must acknowledge (it cannot) or be reported.
        let live: Result<Vec<String>, _> = sqlx::query_scalar(
            "SELECT substr(application_name, $1) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name LIKE $2
             UNION
             SELECT instance FROM auth_replicas WHERE seen_at > now() - make_interval(secs => $3)",
        )
        .bind(LISTENER_APP.len() as i32 + 1)
        .bind(format!("{LISTENER_APP}%"))
        .bind((LISTENER_TRUST + HEARTBEAT_EVERY).as_secs_f64())
        .fetch_all(pool)
        .await;
        let mut waiting: std::collections::HashSet<String> = match live {
            Ok(l) => l.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "fence: could not list replicas");
                return Err(Unconfirmed { replicas: 0 });
            }
        };
        // This replica need not answer when it cannot trust what it hears:
        // caches off, or its LISTEN connection gone (the next one starts from
        // empty and hears only what commits after it listens). Not merely
        // when its trust lapsed: a late echo being applied may make it trust
        // again before it applied this change.
        if !self.enabled || !self.listener_up() {
            waiting.remove(&self.instance.to_string());
        }
        if let Err(e) = crate::store::pg::notify(pool, &format!("fence:{id}")).await {
            tracing::warn!(error = %e, "fence: could not notify");
            return Err(Unconfirmed {
                replicas: waiting.len(),
            });
        }
        let prefix = format!("ack:{id}:");
        let done = tokio::time::timeout(FENCE_WAIT, async {
            while !waiting.is_empty() {
                match rx.recv().await {
                    Ok(p) => {
                        if let Some(inst) = p.strip_prefix(&prefix) {
                            waiting.remove(inst);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        })
        .await;
        if done.is_err() || !waiting.is_empty() {
            tracing::warn!(missing = waiting.len(), "fence: not every replica acknowledged in time");
            return Err(Unconfirmed {
                replicas: waiting.len().max(1),
            });
        }
        Ok(())
    }
}

/// Sends this instance's heartbeat every `HEARTBEAT_EVERY`; the listener
/// hearing it back is what makes the caches usable (see `usable`).
pub async fn heartbeat(pool: PgPool, caches: Arc<AuthCaches>) {
    let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    let mut failing = false;
    loop {
        // Every tick, and at once when a LISTEN connection was just made: its
        // caches are not trusted until this statement's echo comes back.
        tokio::select! {
            _ = tick.tick() => {}
            _ = caches.connected.notified() => {}
        }
        if pool.is_closed() {
            return;
        }
        if caches.listener_up() {
            // The ping and this replica's registration (for writers' fences)
            // in one statement.
            let sent = sqlx::query(
                "INSERT INTO auth_replicas (instance, seen_at)
                 SELECT $3, now() FROM (SELECT pg_notify($1, $2)) AS n
                 ON CONFLICT (instance) DO UPDATE SET seen_at = excluded.seen_at",
            )
            .bind(crate::store::pg::AUTH_CHANNEL)
            .bind(caches.ping())
            .bind(caches.instance.to_string())
            .execute(&pool)
            .await;
            match sent {
                Ok(_) => failing = false,
                // A database without `auth_replicas` is not migrated: no echo
                // ever comes back, so the caches stay off. Said loudly, once
                // per failure streak (a store outage is logged elsewhere).
                Err(e) if !failing => {
                    failing = true;
                    if is_undefined_table(&e) {
                        tracing::error!(error = %e, "auth heartbeat failed: the database is not migrated \
                            (run `mnemosyne migrate`); auth caches stay off until it is");
                    } else {
                        tracing::warn!(error = %e, "auth heartbeat not sent; auth caches are off until it is");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "auth heartbeat not sent"),
            }
            // The replicas heard from within `REPLICA_WINDOW`. Unknown (an
            // error) keeps the last count: it never jumps to "alone".
            let live: Result<i64, _> = sqlx::query_scalar(
                "SELECT count(*) FROM auth_replicas WHERE seen_at > now() - make_interval(secs => $1)",
            )
            .bind(REPLICA_WINDOW.as_secs_f64())
            .fetch_one(&pool)
            .await;
            if let Ok(n) = live {
                caches.live_replicas.store((n as usize).max(1), Ordering::SeqCst);
            }
        }
        ticks += 1;
        if ticks.is_multiple_of(PRUNE_EVERY_TICKS) {
            // Replicas gone for long are forgotten (any one of them prunes).
            let _ = sqlx::query("DELETE FROM auth_replicas WHERE seen_at < now() - interval '1 hour'")
                .execute(&pool)
                .await;
        }
    }
}

/// Postgres' `undefined_table` (42P01): a migration is missing.
fn is_undefined_table(e: &sqlx::Error) -> bool {
    e.as_database_error().and_then(|d| d.code()).as_deref() == Some("42P01")
}

/// The LISTEN task: runs until the process ends. Any error or dropped
/// connection marks the caches unusable, then reconnects with backoff,
/// re-subscribes, empties every cache, and only then marks them usable again.
///
/// `session`: where the LISTEN connection goes (`MNEMOSYNE_DATABASE_LISTEN_URL`,
/// a LISTEN needs a server session of its own); None: where `pool` goes.
pub async fn listen(pool: PgPool, session: Option<PgConnectOptions>, caches: Arc<AuthCaches>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        caches.listener_up.store(false, Ordering::SeqCst);
        if pool.is_closed() {
            return;
        }
        let listener = async {
            // A one-connection pool of its own, named so writers can count us.
            let opts = session
                .clone()
                .unwrap_or_else(|| (*pool.connect_options()).clone())
                .application_name(&format!("{LISTENER_APP}{}", caches.instance));
            let own = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with(opts);
            let mut l = PgListener::connect_with(&own).await?;
            l.listen_all([AUTH_CHANNEL, INDEX_CHANNEL]).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        let mut listener = match listener {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "auth LISTEN connection failed; caches bypassed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        caches.invalidate_all();
        if caches.connections.fetch_add(1, Ordering::SeqCst) > 0 {
            caches.listener_reconnects.inc();
        }
        // Just subscribed: everything from here on is heard, but the caches
        // wait for the first heartbeat echo on this connection (that
        // heartbeat registers the replica for writers' fences).
        caches.echoed.store(false, Ordering::SeqCst);
        caches.listener_up.store(true, Ordering::SeqCst);
        caches.connected.notify_one();
        tracing::debug!("auth LISTEN connected");
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) if n.channel() == INDEX_CHANNEL => {
                    if !caches.index.apply(n.payload()) {
                        tracing::warn!("index LISTEN: a payload that is not `<seq>:<library>`; sequences read again");
                        caches.index.forget_all();
                    }
                }
                Ok(Some(n)) => {
                    let payload = n.payload();
                    caches.apply(payload).await;
                    if let Some(fence) = payload.strip_prefix("fence:") {
                        // Everything before the fence is applied: acknowledge.
                        let ack = format!("ack:{fence}:{}", caches.instance);
                        let pool = pool.clone();
                        tokio::spawn(async move {
                            let _ = crate::store::pg::notify(&pool, &ack).await;
                        });
                    }
                }
                Ok(None) => {
                    tracing::warn!("auth LISTEN connection lost; caches bypassed until reconnect");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "auth LISTEN error; caches bypassed until reconnect");
                    break;
                }
            }
        }
        caches.listener_up.store(false, Ordering::SeqCst);
        caches.echoed.store(false, Ordering::SeqCst);
        caches.invalidate_all();
    }
}

/// Fences shared between writers (`Turns`): a writer joins the next fence,
/// sent once the one out (if any) has ended — so after the writer's change
/// committed, as its own would be — for every writer that joined meanwhile.
pub struct SharedFence {
    caches: Arc<AuthCaches>,
    pool: PgPool,
    /// Where the end of the next fence is told.
    turns: crate::turns::Turns<tokio::sync::watch::Sender<bool>>,
}

impl SharedFence {
    pub fn new(caches: Arc<AuthCaches>, pool: PgPool) -> Arc<SharedFence> {
        Arc::new(SharedFence {
            caches,
            pool,
            turns: Default::default(),
        })
    }

    /// Returns once a fence sent after this call began has ended
    /// (acknowledged by every live replica, or those that did not answer
    /// have stopped trusting what they heard: `AuthCaches::fence`).
    pub async fn wait(self: &Arc<Self>) {
        let mut ended = self.turns.join(|next| match next {
            Some(next) => next.subscribe(),
            None => {
                let (tx, rx) = tokio::sync::watch::channel(false);
                *next = Some(tx);
                let me = self.clone();
                tokio::spawn(async move { me.send_next().await });
                rx
            }
        });
        let _ = ended.wait_for(|done| *done).await;
    }

    async fn send_next(&self) {
        let Some((next, _out)) = self.turns.take().await else {
            return;
        };
        let began = tokio::time::Instant::now();
        if self.caches.fence(&self.pool).await.is_err() {
            // Not confirmed (the replicas could not be listed, the fence not
            // sent, or a replica did not answer): once `FENCE_WAIT` has passed
            // since it began, every replica that has not applied the change
            // has stopped trusting what it heard (its last heartbeat heard was
            // sent before the change committed).
            tokio::time::sleep_until(began + FENCE_WAIT).await;
        }
        next.send_replace(true);
    }
}
