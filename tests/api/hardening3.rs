//! Hardening round 3 (issue 19), rows 7, 8 and 13, and two review findings
//! on the revocation fence and start-up: each test is named after what it
//! shows.

use std::sync::Arc;
use std::time::Duration;

use mnemosyne::auth::cache::{heartbeat, listen, AuthCaches};
use mnemosyne::store::pg::users::{self, Role};
use reqwest::{header, Method, StatusCode};
use serde_json::json;

use crate::admin::{person, staff, Console, STAFF_PASSWORD};
use crate::helpers::{send, TestApp};

/// `name{labels} value` from a Prometheus text page (0 when absent).
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

fn queries(metrics: &str, file: &str) -> f64 {
    sample(
        metrics,
        &format!("graph_query_duration_seconds_count{{query=\"{file}\"}}"),
    )
}

// ---- review finding: caches are trusted from the first heartbeat ----

/// A replica trusts its caches only once its own heartbeat came back on the
/// LISTEN connection: that statement registers it in `auth_replicas`, so
/// from then on every writer's fence counts it even after its listener
/// drops out of `pg_stat_activity`. Connected but not yet registered, it must
/// not trust them (before: trusted from the LISTEN connect).
#[tokio::test]
async fn caches_are_trusted_only_after_the_first_heartbeat_registered_the_replica() {
    let app = TestApp::spawn().await;
    let caches = Arc::new(AuthCaches::new(Duration::from_secs(30)));
    let instance = caches.instance.to_string();
    let listener = tokio::spawn(listen(app.pg.clone(), caches.clone()));
    let mut up = false;
    for _ in 0..500 {
        if caches.listener_up() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(up, "the LISTEN connection came up");
    let registered = |pg: sqlx::PgPool, instance: String| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM auth_replicas WHERE instance = $1")
            .bind(instance)
            .fetch_one(&pg)
            .await
            .unwrap()
    };
    assert_eq!(registered(app.pg.clone(), instance.clone()).await, 0);
    assert!(
        !caches.usable(),
        "caches trusted before the replica is registered for fences"
    );

    let beating = tokio::spawn(heartbeat(app.pg.clone(), caches.clone()));
    let mut usable = false;
    for _ in 0..500 {
        if caches.usable() {
            usable = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(usable, "the first heartbeat echo makes the caches usable");
    assert_eq!(
        registered(app.pg.clone(), instance).await,
        1,
        "usable only once registered"
    );
    listener.abort();
    beating.abort();
}

// ---- review finding: an unmigrated database is refused at start-up ----

#[tokio::test]
async fn serve_refuses_an_unmigrated_database_with_a_clear_message() {
    let app = TestApp::spawn().await;
    let db = format!("{}_empty", app.ns);
    sqlx::query(&format!("CREATE DATABASE \"{db}\""))
        .execute(&app.pg)
        .await
        .unwrap();
    let mut settings = app.settings.clone();
    let (prefix, _) = settings.database_url.rsplit_once('/').unwrap();
    settings.database_url = format!("{prefix}/{db}");
    settings.listen = "127.0.0.1:0".parse().unwrap();
    let err = match mnemosyne::startup::Application::build(settings).await {
        Ok(_) => panic!("served an unmigrated database"),
        Err(e) => format!("{e:#}"),
    };
    sqlx::query(&format!("DROP DATABASE \"{db}\" WITH (FORCE)"))
        .execute(&app.pg)
        .await
        .unwrap();
    assert!(err.contains("the database is not migrated"), "{err}");
    assert!(err.contains("run `mnemosyne migrate` first"), "{err}");
}

// ---- row 7: console storage is bounded, and the console is rate limited ----

/// Hardening 3, row 7: a timer deletes expired sessions and form submissions
/// older than a form's lifetime; live ones stay.
#[tokio::test]
async fn console_storage_is_swept_on_a_timer() {
    let app = TestApp::spawn_with(|s| s.admin_sweep_secs = 1).await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    // A real submission of the live session.
    let page = c.get("/admin/keys").await;
    assert_eq!(page.status, StatusCode::OK);
    let r = c.post("/admin/keys", &[("once", &once_in(&page.body))]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let live: String = sqlx::query_scalar("SELECT id_hash FROM admin_sessions")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    let sam = users::by_username(&app.pg, "sam").await.unwrap().unwrap();
    // Rows as an attacker's loop and abandoned browsers leave them: an old
    // submission of the live session, a session past its absolute expiry
    // and one past its idle expiry, each with a submission.
    let expired_absolute = "a".repeat(64);
    let expired_idle = "b".repeat(64);
    for (id, created, seen) in [(&expired_absolute, 13 * 3600, 10), (&expired_idle, 3600, 3600)] {
        sqlx::query(
            "INSERT INTO admin_sessions (id_hash, user_id, csrf_token, created_at, last_seen_at)
             VALUES ($1, $2, $3, now() - make_interval(secs => $4), now() - make_interval(secs => $5))",
        )
        .bind(id)
        .bind(sam.id)
        .bind("c".repeat(64))
        .bind(created as f64)
        .bind(seen as f64)
        .execute(&app.pg)
        .await
        .unwrap();
        sqlx::query("INSERT INTO admin_form_submissions (session_hash, once) VALUES ($1, 'x')")
            .bind(id)
            .execute(&app.pg)
            .await
            .unwrap();
    }
    sqlx::query(
        "INSERT INTO admin_form_submissions (session_hash, once, at) VALUES ($1, 'old', now() - interval '2 hours')",
    )
    .bind(&live)
    .execute(&app.pg)
    .await
    .unwrap();

    let mut swept = false;
    for _ in 0..100 {
        let left: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM admin_sessions WHERE id_hash <> $1)
                  + (SELECT count(*) FROM admin_form_submissions WHERE once = 'old')",
        )
        .bind(&live)
        .fetch_one(&app.pg)
        .await
        .unwrap();
        if left == 0 {
            swept = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(swept, "expired sessions and old submissions were swept");
    let kept: Vec<String> = sqlx::query_scalar("SELECT session_hash::text FROM admin_form_submissions")
        .fetch_all(&app.pg)
        .await
        .unwrap();
    assert_eq!(kept, [live], "the live session's recent submission is kept");
    assert_eq!(
        c.get("/admin/keys").await.status,
        StatusCode::OK,
        "the live session is kept"
    );
}

async fn count(pg: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pg).await.unwrap()
}

/// The value of the first `name="once"` hidden field.
fn once_in(html: &str) -> String {
    let at = html.find("name=\"once\" value=\"").expect("a once field") + "name=\"once\" value=\"".len();
    html[at..].split('"').next().unwrap().to_owned()
}

/// A form carries its render time: past its lifetime it is refused (so a
/// swept submission can never be replayed), as is a value the console did
/// not make.
#[tokio::test]
async fn a_form_past_its_lifetime_is_refused_and_nothing_is_done() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let before = count(&app.pg, "SELECT count(*) FROM mcp_signing_keys").await;
    let stale = format!("{}.abcdef", chrono::Utc::now().timestamp() - 2 * 3600);
    for once in [stale.as_str(), "made-up"] {
        let r = c.post("/admin/keys", &[("once", once)]).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
        assert!(r.body.contains("Form expired"), "{}", r.body);
    }
    assert_eq!(count(&app.pg, "SELECT count(*) FROM mcp_signing_keys").await, before);
    let recorded = count(&app.pg, "SELECT count(*) FROM admin_form_submissions").await;
    assert_eq!(recorded, 0, "a refused form is not recorded");
}

/// A session keeps at most its cap of submissions, however many forms it
/// posts (the oldest are forgotten).
#[tokio::test]
async fn a_session_keeps_at_most_its_cap_of_form_submissions() {
    use mnemosyne::admin::session::MAX_ONCE_PER_SESSION;
    let app = TestApp::spawn().await;
    person(&app, "pat").await;
    let mut c = Console::signed_in(&app, "pat", STAFF_PASSWORD).await;
    let live: String = sqlx::query_scalar("SELECT id_hash FROM admin_sessions")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO admin_form_submissions (session_hash, once, at)
         SELECT $1, 'loop-' || i, now() - make_interval(secs => 1000 - i)
           FROM generate_series(1, $2) AS i",
    )
    .bind(&live)
    .bind((MAX_ONCE_PER_SESSION + 50) as i32)
    .execute(&app.pg)
    .await
    .unwrap();
    let page = c.get("/admin/me").await;
    let once = once_in(&page.body);
    // A form with a fresh once value is taken (refused later for its empty name).
    let r = c.post("/admin/me/tokens", &[("once", &once), ("name", "")]).await;
    assert_ne!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT once FROM admin_form_submissions WHERE session_hash = $1 ORDER BY at DESC")
            .bind(&live)
            .fetch_all(&app.pg)
            .await
            .unwrap();
    assert_eq!(rows.len() as i64, MAX_ONCE_PER_SESSION, "capped");
    assert!(rows.contains(&once), "the new submission is recorded");
    assert!(!rows.contains(&"loop-1".to_owned()), "the oldest were forgotten");
    // And its reload is still refused.
    let again = c.post("/admin/me/tokens", &[("once", &once), ("name", "")]).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert!(again.body.contains("Already done"), "{}", again.body);
}

/// Hardening 3, row 7: the console has a per-user rate (every page and form
/// of a signed-in user), answered 429 with Retry-After; other users keep
/// their own.
#[tokio::test]
async fn the_console_is_rate_limited_per_signed_in_user_with_retry_after() {
    // 12 a minute: bursts of 2.
    let app = TestApp::spawn_with(|s| s.admin_rate_limit_per_minute = 12).await;
    person(&app, "pat").await;
    person(&app, "kim").await;
    let mut pat = Console::signed_in(&app, "pat", STAFF_PASSWORD).await;
    let mut limited = None;
    for _ in 0..20 {
        let r = pat.get("/admin/me").await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(r);
            break;
        }
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let r = limited.expect("pat was limited");
    let secs: u64 = r.headers[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!(secs >= 1);
    assert!(r.body.contains("Too many console requests"), "{}", r.body);
    assert_eq!(r.headers[header::CACHE_CONTROL], "no-store");
    // Forms count too.
    let f = pat.post("/admin/me/tokens", &[("name", "t")]).await;
    assert_eq!(f.status, StatusCode::TOO_MANY_REQUESTS, "{}", f.body);
    // Another user is not limited by pat's requests.
    let mut kim = Console::signed_in(&app, "kim", STAFF_PASSWORD).await;
    assert_eq!(kim.get("/admin/me").await.status, StatusCode::OK);
}

/// Hardening 3, row 7: sign-ins are limited per client address (right or
/// wrong password), before the form is read, 429 with Retry-After.
#[tokio::test]
async fn sign_ins_are_rate_limited_per_address_with_retry_after() {
    // 6 a minute: a burst of 1.
    let app = TestApp::spawn_with(|s| s.admin_sign_in_per_minute = 6).await;
    person(&app, "pat").await;
    let mut c = Console::new(&app);
    let first = c.sign_in("pat", STAFF_PASSWORD).await;
    assert_eq!(first.status, StatusCode::SEE_OTHER, "{}", first.body);
    let mut limited = None;
    for _ in 0..10 {
        let mut other = Console::new(&app);
        let r = other.sign_in("pat", STAFF_PASSWORD).await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("sign-ins from one address were limited");
    assert!(r.headers.get(header::RETRY_AFTER).is_some());
    assert!(r.body.contains("Too many sign-ins from your address"), "{}", r.body);
    // The signed-in session is not affected (its own, per-user rate).
    assert_eq!(c.get("/admin/me").await.status, StatusCode::OK);
}

// ---- row 8: cheap console pages ----

/// Hardening 3, row 8: `/admin/me` names the picker's libraries with one
/// read of just those libraries; nothing counts every library's items.
#[tokio::test]
async fn the_token_picker_reads_only_its_own_libraries_names() {
    let app = TestApp::spawn().await;
    person(&app, "pat").await;
    let mine = app.library("pats-notes").await;
    let absent = app.uid("not-ingested");
    users::grant(&app.pg, "pat", &mine, Role::Owner).await.unwrap();
    users::grant(&app.pg, "pat", &absent, Role::Manager).await.unwrap();
    let mut c = Console::signed_in(&app, "pat", STAFF_PASSWORD).await;
    let before = app.metrics().await;
    let page = c.get("/admin/me").await;
    assert_eq!(page.status, StatusCode::OK);
    let after = app.metrics().await;
    assert!(page.body.contains(">pats-notes"), "{}", page.body);
    assert!(page.body.contains(&format!("value=\"{mine}\"")), "{}", page.body);
    assert!(page.body.contains("(not in the graph yet)"), "{}", page.body);
    assert_eq!(
        queries(&after, "library_names.cypher") - queries(&before, "library_names.cypher"),
        1.0
    );
    for whole_graph in [
        "all_libraries.cypher",
        "library_list.cypher",
        "admin_libraries_page.cypher",
    ] {
        assert_eq!(
            queries(&after, whole_graph),
            queries(&before, whole_graph),
            "{whole_graph}"
        );
    }
    // And a token minted from it is scoped as picked.
    let r = c
        .post("/admin/me/tokens", &[("name", "mine"), ("library", &mine)])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// Hardening 3, row 8: the libraries page is paginated in uid order (a page
/// and a link to the next), counting only the libraries it shows.
#[tokio::test]
async fn the_libraries_page_is_paginated() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let libs = [
        app.library("page_a").await,
        app.library("page_b").await,
        app.library("page_c").await,
    ];
    users::grant(&app.pg, "sam", &libs[1], Role::Owner).await.unwrap();
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    // The graph is shared with other tests: start just before ours.
    let start = app.uid("page_");
    let first = c.get(&format!("/admin/libraries?after={start}&limit=2")).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert!(
        first.body.contains(&libs[0]) && first.body.contains(&libs[1]),
        "{}",
        first.body
    );
    assert!(!first.body.contains(&libs[2]), "{}", first.body);
    let next = format!("/admin/libraries?after={}&amp;limit=2", libs[1]);
    assert!(first.body.contains(&next), "{}", first.body);
    let second = c.get(&next.replace("&amp;", "&")).await;
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.body.contains(&libs[2]), "{}", second.body);
    assert!(!second.body.contains(&libs[0]) && !second.body.contains(&libs[1]));
    // The membership count is the page's own.
    let row = first.body.split(&format!("<code>{}</code>", libs[1])).nth(1).unwrap();
    let members = row.split("</tr>").next().unwrap();
    assert!(members.ends_with("<td class=\"num\">1</td>"), "{members}");
    // A library's own page reads just it.
    let detail = c.get(&format!("/admin/library?uid={}", libs[2])).await;
    assert_eq!(detail.status, StatusCode::OK);
    assert!(detail.body.contains("page_c"), "{}", detail.body);
}

// ---- row 13: a timed-out ingest tells the truth ----

/// Hardening 3, row 13: an ingest whose graph wait runs out is a 503 that
/// says the request is safe to send again (the abandoned write may still
/// commit after the answer: it is whole or absent), and after the retry the
/// item is whole — its chunks are exactly one request's.
#[tokio::test]
async fn a_timed_out_ingest_is_a_retry_safe_503_and_the_retry_leaves_the_item_whole() {
    let app = TestApp::spawn().await;
    let mut settings = app.settings.clone();
    settings.store_timeout_ms = 50;
    let impatient = app.replica_with(settings).await;
    let ws = app.uid("ws");
    let uid = app.uid("big");
    let content = (0..400)
        .map(|p| (0..100).map(|w| format!("r13x{p}w{w}")).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n");
    let body = json!({"workspace_id": ws, "item": {"title": "Big", "uid": uid}, "content": content});
    let (status, answer) = send(impatient.service(Method::POST, "/library/api/ingest/").json(&body)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["error"], "unavailable");
    assert_eq!(answer["store"], "graph");
    assert_eq!(answer["retry_safe"], true);
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("sending the same request again is safe"),
        "{answer}"
    );
    // The same request again, with time to finish (it may meet the first
    // one's write still running: they touch the same fence, one waits).
    let (status, retried) = send(app.service(Method::POST, "/library/api/ingest/").json(&body)).await;
    assert!(status.is_success(), "{status} {retried}");
    let expected = retried["chunk_count"].as_i64().unwrap();
    assert!(expected > 1);
    let item = app
        .state
        .admin
        .find_item(&uid)
        .await
        .unwrap()
        .expect("the item is there after the retry");
    assert_eq!(item.chunk_count, expected);
    let rows = app
        .state
        .admin
        .rows_for_tests(
            neo4rs::query("MATCH (c:Chunk {item_uid: $item}) RETURN c.ordinal AS ordinal ORDER BY ordinal")
                .param("item", uid.as_str()),
        )
        .await
        .unwrap();
    let ordinals: Vec<i64> = rows.iter().map(|r| r.get("ordinal").unwrap()).collect();
    assert_eq!(
        ordinals,
        (0..expected).collect::<Vec<_>>(),
        "one request's chunks, whole"
    );
}
