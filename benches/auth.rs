#![allow(clippy::cloned_ref_to_slice_refs)]
//! Warm bearer resolution per credential kind (goal: ≤ 20 µs each; a team JWT
//! with 50 directly granted libraries within 2 µs of the workspace-only one,
//! issue 53), the cold
//! team path (team and workspace caches empty: one Postgres and one graph round
//! trip), and everything uncached (plus the key lookup). Needs `scripts/dev up`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use mnemosyne::auth::cache::{heartbeat, listen, AuthCaches};
use mnemosyne::auth::resolver::RequestContext;
use mnemosyne::auth::{jwt, Authenticator};
use mnemosyne::metrics::Metrics;
use mnemosyne::store::graph::GraphStore;
use mnemosyne::store::pg::{keys, teams, users};
use serde_json::json;
use uuid::Uuid;

struct Fixture {
    auth: Arc<Authenticator>,
    cold: Arc<Authenticator>,
    opaque: String,
    team: String,
    /// A team JWT with one workspace and 50 directly granted libraries.
    team_direct: String,
    per_turn: String,
    admin: String,
    url: String,
}

async fn fixture() -> Fixture {
    let (settings, pool, admin) = common::fresh_settings("auth").await;
    let graph = GraphStore::connect(&settings).await.unwrap();
    let graph = graph.into_handles();
    let ws = format!("bench_{}", &Uuid::new_v4().simple().to_string()[..8]);
    let (lib, _) = graph.admin.ensure_workspace_library(&ws).await.unwrap().unwrap();
    users::create(&pool, "bench", None, false).await.unwrap();
    users::grant(&pool, "bench", &lib, users::Role::Owner).await.unwrap();
    let opaque = mnemosyne::service::tokens::mint(&pool, "bench", "b", &[lib.clone()], None)
        .await
        .unwrap()
        .plaintext;
    let key = keys::newest_active(&pool).await.unwrap().unwrap();
    let secret = hex::decode(&key.secret_hex).unwrap();
    let team_id = Uuid::new_v4();
    let jti = Uuid::new_v4();
    teams::create(&pool, "bench", team_id, "Bench", jti).await.unwrap();
    teams::replace_workspaces(&pool, "bench", team_id, &[ws.clone()])
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let team = jwt::mint_team_jwt(team_id, jti, &key.kid, &secret, now).unwrap();
    // The same workspace plus 50 user-managed libraries granted directly.
    let mut direct = Vec::new();
    for i in 0..50 {
        let uid = format!("{ws}_direct_{i:02}");
        graph
            .admin
            .create_library(&uid, &uid, "", mnemosyne::analysis::Language::English)
            .await
            .unwrap();
        direct.push(uid);
    }
    let (direct_id, direct_jti) = (Uuid::new_v4(), Uuid::new_v4());
    teams::create(&pool, "bench", direct_id, "Bench direct", direct_jti)
        .await
        .unwrap();
    teams::replace_workspaces(&pool, "bench", direct_id, &[ws.clone()])
        .await
        .unwrap();
    teams::replace(&pool, "bench", direct_id, teams::Grants::Libraries, &direct)
        .await
        .unwrap();
    let team_direct = jwt::mint_team_jwt(direct_id, direct_jti, &key.kid, &secret, now).unwrap();
    let per_turn = jwt::sign_hs256(
        &json!({"iss": "daedalus", "sub": "daedalus-chat", "iat": now, "exp": now + 600,
                "jti": Uuid::new_v4().to_string(), "libs": [lib]}),
        &key.kid,
        &secret,
    )
    .unwrap();
    let caches = Arc::new(AuthCaches::new(Duration::from_secs(300)));
    // The listener and its heartbeat, as a server runs them: caches are used
    // only while this instance hears its own heartbeat (without it every
    // "warm" resolution was a bypassed, cold one: 0.3 ms instead of 0.6 µs).
    tokio::spawn(listen(pool.clone(), None, caches.clone()));
    tokio::spawn(heartbeat(pool.clone(), caches.clone()));
    while !caches.usable() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let auth = Arc::new(Authenticator::new(
        pool.clone(),
        graph.workspaces.clone(),
        caches,
        Metrics::new(),
        Duration::from_secs(5),
    ));
    let cold = Arc::new(Authenticator::new(
        pool,
        graph.workspaces,
        Arc::new(AuthCaches::new(Duration::ZERO)),
        Metrics::new(),
        Duration::from_secs(5),
    ));
    Fixture {
        auth,
        cold,
        opaque,
        team,
        team_direct,
        per_turn,
        admin,
        url: settings.database_url,
    }
}

fn bench(c: &mut Criterion) {
    mnemosyne::telemetry::init(mnemosyne::config::LogFormat::Text);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let f = rt.block_on(fixture());
    let session = RequestContext {
        session_id: Some("bench-session"),
        session_owner: None,
    };
    // warm every cache once (and bind the per-turn jti to the session)
    rt.block_on(async {
        f.auth.authenticate(&f.opaque, RequestContext::default()).await.unwrap();
        f.auth.authenticate(&f.team, RequestContext::default()).await.unwrap();
        let p = f
            .auth
            .authenticate(&f.team_direct, RequestContext::default())
            .await
            .unwrap();
        assert_eq!(p.0.libraries().len(), 51);
        f.auth.authenticate(&f.per_turn, session).await.unwrap();
    });
    let mut g = c.benchmark_group("resolve_warm");
    g.measurement_time(Duration::from_secs(4));
    g.bench_function("opaque_token", |b| {
        b.to_async(&rt)
            .iter(|| async { f.auth.authenticate(&f.opaque, RequestContext::default()).await.unwrap() })
    });
    g.bench_function("team_jwt", |b| {
        b.to_async(&rt)
            .iter(|| async { f.auth.authenticate(&f.team, RequestContext::default()).await.unwrap() })
    });
    g.bench_function("team_jwt_50_direct_libraries", |b| {
        b.to_async(&rt).iter(|| async {
            f.auth
                .authenticate(&f.team_direct, RequestContext::default())
                .await
                .unwrap()
        })
    });
    g.bench_function("per_turn_jwt_in_session", |b| {
        b.to_async(&rt)
            .iter(|| async { f.auth.authenticate(&f.per_turn, session).await.unwrap() })
    });
    g.finish();
    // What the guard and the tool wrapper add per request since issue 24:
    // the deployment-wide rate check (two replicas) and the usage count.
    let mut g = c.benchmark_group("per_request");
    g.measurement_time(Duration::from_secs(3));
    let limits =
        mnemosyne::limits::RateLimits::shared(u32::MAX, u32::MAX, Arc::new(std::sync::atomic::AtomicUsize::new(2)));
    g.bench_function("rate_limit_check", |b| {
        b.iter(|| limits.request("token:1", None).is_ok())
    });
    let usage = mnemosyne::usage::UsageCounter::default();
    g.bench_function("usage_record", |b| {
        b.iter(|| usage.record("token", "token:1", 3, "search", "ok"))
    });
    // What per-library activity adds to a search answering from 3 libraries.
    let activity = mnemosyne::activity::ActivityCounter::default();
    let reader = mnemosyne::activity::Reader::new("token", "token:1", Some("user:1"));
    let reads: Vec<(String, u64)> = (0..3).map(|i| (format!("lib_{i}"), 3)).collect();
    g.bench_function("activity_record_3_libraries", |b| {
        b.iter(|| activity.record(&reader, "search", Some("q"), &reads))
    });
    g.finish();
    let mut g = c.benchmark_group("resolve_cold");
    // The team's row and its workspaces' libraries uncached, the key cached:
    // one Postgres and one graph round trip.
    g.bench_function("team_jwt_cold_team", |b| {
        b.to_async(&rt).iter(|| async {
            f.auth.caches.teams.invalidate_all();
            f.auth.caches.workspace_libraries.invalidate_all();
            f.auth.authenticate(&f.team, RequestContext::default()).await.unwrap()
        })
    });
    g.measurement_time(Duration::from_secs(4)).sample_size(30);
    g.bench_function("team_jwt_no_cache", |b| {
        b.to_async(&rt)
            .iter(|| async { f.cold.authenticate(&f.team, RequestContext::default()).await.unwrap() })
    });
    g.finish();
    rt.block_on(common::drop_db(&f.admin, &f.url));
}

criterion_group!(benches, bench);
criterion_main!(benches);
