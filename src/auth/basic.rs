//! HTTP Basic for the service APIs (`/mcp_server/api/…`, `/library/api/…`):
//! a handler that takes `ServiceAccount` cannot run unless the caller is an
//! active service user with the right password.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::{Duration, Instant};

use argon2::password_hash::rand_core::RngCore;
use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use axum::extract::{ConnectInfo, FromRef, FromRequestParts};
use axum::http::{header, request::Parts};
use base64::Engine;
use governor::{clock::Clock, clock::DefaultClock, DefaultKeyedRateLimiter, Quota, RateLimiter};
use sha2::{Digest, Sha256};
use tokio::sync::{OnceCell, Semaphore};

use crate::auth::Authenticator;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::proxies::{rate_key, ClientAddress};
use crate::store::pg::users;

/// What verifying a service account needs (the application state provides it).
#[derive(Clone)]
pub struct BasicContext {
    pub pg: sqlx::PgPool,
    pub auth: Arc<Authenticator>,
    pub guard: Arc<BasicGuard>,
    pub metrics: Metrics,
}

/// The authenticated service account of a request.
#[derive(Clone, Debug)]
pub struct ServiceAccount {
    pub username: String,
}

/// argon2id PHC string of a password.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Ok(Argon2::default().hash_password(password.as_bytes(), &salt)?.to_string())
}

/// A real hash to verify against when the username does not exist, so a
/// wrong username costs the same as a wrong password.
static DUMMY_HASH: LazyLock<String> = LazyLock::new(|| hash_password("mnemosyne-timing-equaliser").unwrap_or_default());

/// How long a request waits for a verification slot before a 503.
const VERIFY_QUEUE_WAIT: Duration = Duration::from_secs(2);
/// Longest username considered (longer: refused without a lookup).
const MAX_USERNAME: usize = 150;

/// What keeps HTTP Basic from being flooded (one per replica):
/// - argon2 runs on a bounded number of permits, each held until its hash is
///   done (a client that disconnects does not free it early);
/// - a credential that verified before (a salted fingerprint, remembered for a
///   day) takes a lane of its own, so the service account is verified promptly
///   even while wrong passwords queue in the other lane;
/// - failed attempts are counted per username from an address and per client
///   address (`client_address`: behind a trusted proxy, the forwarded one);
///   past the limit, further unknown credentials from that address get 429
///   before any lookup or hash. Only an address's own failures refuse it.
pub struct BasicGuard {
    normal: Arc<Semaphore>,
    normal_permits: usize,
    priority: Arc<Semaphore>,
    pepper: [u8; 32],
    known_good: moka::sync::Cache<[u8; 32], ()>,
    /// Failures a minute allowed per key over the whole deployment (0: no
    /// throttle); each replica counts its share (`replicas`).
    failures_per_minute: u32,
    /// Live replicas (`AuthCaches::live_replicas`); 1 until set.
    replicas: Arc<AtomicUsize>,
    /// The failure counters of the replica count they were built for
    /// (rebuilt, with full bursts, when it changes; the throttles already
    /// set in `throttled` stay).
    failures: RwLock<Option<FailureCounters>>,
    throttled: moka::sync::Cache<String, Instant>,
    /// argon2 hashes running now, and the most ever at once.
    hashing: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    /// argon2 hashes run so far.
    hashed: Arc<AtomicUsize>,
    /// Verifications in flight by credential fingerprint: identical
    /// concurrent credentials share one lookup and one hash (a sync burst
    /// right after a cache flush costs one argon2, not one per request).
    flights: Mutex<HashMap<Flight, Arc<OnceCell<Verdict>>>>,
}

/// Failure counters per key, and the replica count they were built for.
type FailureCounters = (usize, DefaultKeyedRateLimiter<String>);

/// One credential checked for one kind of account.
type Flight = ([u8; 32], Accept);

/// A request's place in a flight. When it goes — answered, or dropped by a
/// client that hung up or a deadline — the flight is forgotten if it has
/// landed or no other request waits on it, so abandoned flights never pile up.
struct Boarding<'a> {
    guard: &'a BasicGuard,
    key: Flight,
    cell: Arc<OnceCell<Verdict>>,
}

impl Drop for Boarding<'_> {
    fn drop(&mut self) {
        let mut flights = self.guard.flights.lock().unwrap_or_else(|e| e.into_inner());
        // Joins clone under this lock: the map's copy and ours make 2 when
        // no other request holds the flight.
        let forget = flights
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cell) && (self.cell.initialized() || Arc::strong_count(c) <= 2));
        if forget {
            flights.remove(&self.key);
        }
    }
}
/// What a verification found: the account, `None` for a wrong credential,
/// or why it could not be checked.
type Verdict = Result<Option<users::User>, ApiError>;

impl BasicGuard {
    /// `permits` argon2 verifications at once in the normal lane (one more
    /// in the known-good lane); `failures_per_minute` per username and
    /// address, for the whole deployment (see `with_replicas`).
    pub fn new(permits: usize, failures_per_minute: u32) -> Self {
        let mut pepper = [0u8; 32];
        OsRng.fill_bytes(&mut pepper);
        BasicGuard {
            normal: Arc::new(Semaphore::new(permits.max(1))),
            normal_permits: permits.max(1),
            priority: Arc::new(Semaphore::new(1)),
            pepper,
            known_good: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_idle(Duration::from_secs(24 * 3600))
                .build(),
            failures_per_minute,
            replicas: Arc::new(AtomicUsize::new(1)),
            failures: RwLock::new(None),
            throttled: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(120))
                .build(),
            hashing: Arc::new(AtomicUsize::new(0)),
            peak: Arc::new(AtomicUsize::new(0)),
            hashed: Arc::new(AtomicUsize::new(0)),
            flights: Mutex::new(HashMap::new()),
        }
    }

    /// Counts failures deployment-wide: each replica allows its share of
    /// the configured rate, divided by `replicas` (the live replicas, as the
    /// MCP rate limits do), so N replicas do not allow N× the guesses.
    pub fn with_replicas(mut self, replicas: Arc<AtomicUsize>) -> Self {
        self.replicas = replicas;
        self
    }

    /// The failure counters for the current replica count.
    fn failure_counters(&self) -> Option<std::sync::RwLockReadGuard<'_, Option<FailureCounters>>> {
        let per_minute = NonZeroU32::new(self.failures_per_minute)?;
        let n = self.replicas.load(Ordering::SeqCst).max(1);
        {
            let current = self.failures.read().unwrap_or_else(|e| e.into_inner());
            if current.as_ref().is_some_and(|(built, _)| *built == n) {
                return Some(current);
            }
        }
        {
            let mut w = self.failures.write().unwrap_or_else(|e| e.into_inner());
            if w.as_ref().is_none_or(|(built, _)| *built != n) {
                let share = NonZeroU32::new(per_minute.get().div_ceil(n as u32)).unwrap_or(per_minute);
                let burst = NonZeroU32::new((share.get() / 6).max(3)).unwrap_or(share);
                *w = Some((n, RateLimiter::dashmap(Quota::per_minute(share).allow_burst(burst))));
            }
        }
        Some(self.failures.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Joins the verification of `key` in flight, or starts one.
    fn join(&self, key: Flight) -> Boarding<'_> {
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        let cell = flights.entry(key).or_default().clone();
        Boarding { guard: self, key, cell }
    }

    /// Flights in the map now (bounded by the requests waiting on them).
    pub fn flights(&self) -> usize {
        self.flights.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The most argon2 hashes that ever ran at once on this replica.
    pub fn peak_hashing(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// How many argon2 hashes this replica has run.
    pub fn hashes(&self) -> usize {
        self.hashed.load(Ordering::SeqCst)
    }

    /// Permits of both lanes together: the most hashes that can run at once.
    pub fn max_hashing(&self) -> usize {
        self.normal_permits + 1
    }

    fn fingerprint(&self, username: &str, password: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.pepper);
        h.update(username.as_bytes());
        h.update([0]);
        h.update(password.as_bytes());
        h.finalize().into()
    }

    /// Seconds until `key` may try again, if it is throttled.
    fn throttled_for(&self, key: &str) -> Option<u64> {
        let until = self.throttled.get(key)?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then(|| left.as_secs_f64().ceil().max(1.0) as u64)
    }

    fn record_failure(&self, keys: Vec<String>) {
        for key in keys {
            self.count_failure(key);
        }
    }

    /// Counts one failure of `key`; when that puts it over the limit, it is
    /// throttled until the counter allows another: the time it ends then.
    fn count_failure(&self, key: String) -> Option<Instant> {
        let counters = self.failure_counters()?;
        let (_, f) = counters.as_ref()?;
        let not_until = f.check_key(&key).err()?;
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        let until = Instant::now() + wait.max(Duration::from_secs(1));
        self.throttled.insert(key, until);
        Some(until)
    }

    /// A failed sign-in of `username` from `address`, counted for the
    /// account from every address. Over that count the account is under a
    /// spread-out guess: each address that fails on it from then on is
    /// throttled for it at once (on its first failure, not after its own
    /// limit), until the account's count allows again. An address that has
    /// not failed is never refused for it, so a flood from elsewhere cannot
    /// lock the person out of their right password (issue 32).
    fn record_account_failure(&self, username: &str, address_key: &str) {
        let account = format!("acct:{username}");
        let until = self
            .count_failure(account.clone())
            .or_else(|| self.throttled.get(&account).filter(|t| *t > Instant::now()));
        if let Some(until) = until {
            let own = self.throttled.get(address_key).unwrap_or(until);
            self.throttled.insert(address_key.to_owned(), own.max(until));
        }
    }

    /// Forgets idle failure counters (bounded memory after a flood).
    pub fn shrink(&self) {
        let counters = self.failures.read().unwrap_or_else(|e| e.into_inner());
        if let Some((_, f)) = counters.as_ref() {
            f.retain_recent();
            f.shrink_to_fit();
        }
    }
}

fn verify(password: &str, phc: &str) -> bool {
    PasswordHash::new(phc)
        .map(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
        .unwrap_or(false)
}

fn parse_basic(parts: &Parts) -> Option<(String, String)> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, b64) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

/// The key of the client's address for per-address throttles: the address
/// the accept loop resolved (the peer, or what a trusted proxy forwarded,
/// see `proxies`), IPv6 grouped by /64.
pub fn client_address(parts: &Parts) -> String {
    let ip = match parts.extensions.get::<ClientAddress>() {
        Some(c) => Some(c.0),
        None => parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()),
    };
    ip.map(rate_key).unwrap_or_else(|| "unknown".to_owned())
}

impl<S> FromRequestParts<S> for ServiceAccount
where
    S: Send + Sync,
    BasicContext: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let state = &BasicContext::from_ref(state);
        let (username, password) = parse_basic(parts).ok_or(ApiError::BasicUnauthorized)?;
        if username.is_empty() || username.len() > MAX_USERNAME {
            return Err(ApiError::BasicUnauthorized);
        }
        let caches = &state.auth.caches;
        let key = hex::encode(Sha256::digest(format!("{username}\0{password}").as_bytes()));
        let address = client_address(parts);
        let username = caches
            .basic
            .read_through(caches.usable(), key, || async {
                let u = verify_password(state, username, password, address, Accept::ServiceAccount).await?;
                Ok::<_, ApiError>(Arc::new(u.username))
            })
            .await?;
        Ok(ServiceAccount {
            username: username.to_string(),
        })
    }
}

/// Who may pass a password check, and how failures are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Accept {
    /// HTTP Basic: active service accounts. Failures count per username from
    /// an address and per address only — a flood of wrong passwords for the
    /// service account from elsewhere cannot lock out its own address
    /// (argon2's permits already bound the cost).
    ServiceAccount,
    /// Console sign-in: active people. Failures also count per account from
    /// every address: past that count, each address that fails on the
    /// account is throttled for it on its first failure, so guessing a staff
    /// password from many addresses is slowed too, while an address that has
    /// not failed keeps signing in with the right password.
    Person,
}

/// A password check with the flood protection of HTTP Basic: throttles, a
/// bounded verification lane, the user row, argon2. Any user `accept` does
/// not admit answers exactly like a wrong password.
pub async fn verify_password(
    state: &BasicContext,
    username: String,
    password: String,
    address: String,
    accept: Accept,
) -> Result<users::User, ApiError> {
    let guard = &state.guard;
    let fingerprint = guard.fingerprint(&username, &password);
    let known = guard.known_good.contains_key(&fingerprint);
    // Only keys of this address refuse it: another address's failures never
    // lock it out of a right password (see `record_account_failure`).
    let address_key = format!("u:{username}|a:{address}");
    let throttle_keys = vec![address_key.clone(), format!("a:{address}")];
    // People's failures also count per account (HTTP Basic's service
    // accounts: per address only, argon2's permits bound the cost).
    let account = (accept == Accept::Person).then(|| username.clone());
    if !known {
        if let Some(secs) = throttle_keys.iter().filter_map(|k| guard.throttled_for(k)).max() {
            state.metrics.rate_limited.with_label_values(&["basic", "-"]).inc();
            return Err(ApiError::RateLimited {
                retry_after_secs: secs,
                message: "Too many failed sign-ins; retry later.".into(),
            });
        }
    }
    let boarding = guard.join((fingerprint, accept));
    let verdict = boarding
        .cell
        .get_or_init(|| check_password(state, username, password, known, accept))
        .await
        .clone();
    drop(boarding);
    match verdict? {
        Some(u) => {
            guard.known_good.insert(fingerprint, ());
            Ok(u)
        }
        None => {
            guard.record_failure(throttle_keys);
            if let Some(account) = &account {
                guard.record_account_failure(account, &address_key);
            }
            Err(ApiError::BasicUnauthorized)
        }
    }
}

/// The lookup and the hash of one flight, in the lane `known` picks.
async fn check_password(
    state: &BasicContext,
    username: String,
    password: String,
    known: bool,
    accept: Accept,
) -> Verdict {
    let guard = &state.guard;
    let lane = if known { &guard.priority } else { &guard.normal };
    let permit = tokio::time::timeout(VERIFY_QUEUE_WAIT, lane.clone().acquire_owned())
        .await
        .map_err(|_| ApiError::StoreUnavailable("password verifier"))?
        .map_err(|_| ApiError::StoreUnavailable("password verifier"))?;
    let user = users::by_username(&state.pg, &username).await?;
    let phc = user
        .as_ref()
        .and_then(|u| u.password_hash.clone())
        .unwrap_or_else(|| DUMMY_HASH.clone());
    // The permit moves into the hashing task: it is released when the hash
    // is done, not when the client goes away.
    let (hashing, peak, hashed) = (guard.hashing.clone(), guard.peak.clone(), guard.hashed.clone());
    let ok = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        hashed.fetch_add(1, Ordering::SeqCst);
        let now = hashing.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(now, Ordering::SeqCst);
        let ok = verify(&password, &phc);
        hashing.fetch_sub(1, Ordering::SeqCst);
        ok
    })
    .await
    .unwrap_or(false);
    // A right password of a non-service or disabled account answers exactly
    // like a wrong one.
    Ok(user
        .filter(|u| ok && u.active && u.password_hash.is_some() && u.is_service == (accept == Accept::ServiceAccount)))
}
