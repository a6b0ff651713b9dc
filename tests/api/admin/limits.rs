//! The console's bounds (hardening 3, row 7): its storage is swept on a
//! timer, a form has a lifetime and a session a cap of recorded
//! submissions, and pages, forms and sign-ins are rate limited.

use std::time::Duration;

use mnemosyne::store::pg::users;
use reqwest::{header, StatusCode};

use super::{person, staff, Console, STAFF_PASSWORD};
use crate::helpers::TestApp;

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
