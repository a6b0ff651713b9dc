//! Issue 53 part 2: per-library read activity — who read a library, with
//! which tool, how many calls and results, per hour — for its owners and
//! managers (and staff), through the console and `mnemosyne audit library`.

use std::time::Duration;

use mnemosyne::store::pg::tokens;
use mnemosyne::store::pg::users::{self, Role};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::admin::{person, staff, Console, STAFF_PASSWORD};
use crate::helpers::TestApp;
use crate::mcp::seed;

/// `audit library UID --json` as the CLI prints it, `--as` a user when given.
fn cli_rows(app: &TestApp, uid: &str, as_user: Option<&str>) -> Vec<Value> {
    let mut args = vec!["--json", "audit", "library", uid, "--since", "1d"];
    if let Some(u) = as_user {
        args.extend(["--as", u]);
    }
    let out: Value = serde_json::from_str(&app.cli_ok(&args)).unwrap();
    out.as_array().unwrap().clone()
}

/// (kind, reader id, user or team name, tool, calls, results), sorted.
fn summary(rows: &[Value]) -> Vec<(String, String, String, String, i64, i64)> {
    let mut v: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r["reader_kind"].as_str().unwrap().to_owned(),
                r["reader_id"].as_str().unwrap().to_owned(),
                r["user"].as_str().or(r["team_name"].as_str()).unwrap_or("").to_owned(),
                r["tool"].as_str().unwrap().to_owned(),
                r["calls"].as_i64().unwrap(),
                r["results"].as_i64().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn results_from(out: &Value, lib: &str) -> i64 {
    out["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["library_uid"] == lib)
        .count() as i64
}

#[tokio::test]
async fn an_owner_sees_reads_of_their_library_by_another_users_token_and_by_a_team_with_exact_counts() {
    // No timed flush during the test: the replica is flushed by hand.
    let app = TestApp::spawn_with(|s| s.usage_flush_secs = 3600).await;
    let s = seed(&app).await;
    let olga = person(&app, "olga").await;
    users::grant(&app.pg, &olga, &s.lib_c, Role::Owner).await.unwrap();
    // bob, another user, manages lib_c and owns lib_a; his token reads both
    users::create(&app.pg, "bob", None, false).await.unwrap();
    users::grant(&app.pg, "bob", &s.lib_c, Role::Manager).await.unwrap();
    users::grant(&app.pg, "bob", &s.lib_a, Role::Owner).await.unwrap();
    let token = mnemosyne::service::tokens::mint(&app.pg, "bob", "t", &[s.lib_c.clone(), s.lib_a.clone()], None)
        .await
        .unwrap()
        .plaintext;
    let token_id = tokens::list(&app.pg, Some("bob")).await.unwrap()[0].id.to_string();
    let (team, jwt) = app.create_team("Readers").await;
    app.put_libraries(team, &[s.lib_c.clone()]).await;

    let mut t = app.mcp(&token).connect().await;
    let mut token_results = 0;
    for _ in 0..3 {
        token_results += results_from(&t.call_ok("search", json!({"query": "zanzibarine"})).await, &s.lib_c);
    }
    assert_eq!(token_results, 3, "one chunk of lib_c matches each time");
    let hit = t
        .call_ok("search", json!({"query": "glacier", "library_uids": [s.lib_c]}))
        .await;
    let chunk = hit["results"][0]["chunk_uid"].as_str().unwrap().to_owned();
    t.call_ok("get_chunk", json!({"chunk_uid": chunk})).await;
    // a refused or failed call reads nothing
    t.call("search", json!({"query": ""})).await;
    let mut m = app.mcp(&jwt).connect().await;
    for _ in 0..2 {
        m.call_ok("search", json!({"query": "zanzibarine"})).await;
    }
    m.call_ok("list_libraries", json!({})).await;
    m.call_ok("list_items", json!({"library_uid": s.lib_c})).await;

    // nothing is in Postgres before a flush (the request path never writes)
    assert!(cli_rows(&app, &s.lib_c, None).is_empty());
    app.state.metrics.activity.flush(&app.pg).await;

    let team_s = team.to_string();
    let want = vec![
        (
            "team".to_owned(),
            team_s.clone(),
            "Readers".to_owned(),
            "list_items".to_owned(),
            1,
            1,
        ),
        (
            "team".to_owned(),
            team_s.clone(),
            "Readers".to_owned(),
            "list_libraries".to_owned(),
            1,
            1,
        ),
        (
            "team".to_owned(),
            team_s.clone(),
            "Readers".to_owned(),
            "search".to_owned(),
            2,
            2,
        ),
        (
            "token".to_owned(),
            token_id.clone(),
            "bob".to_owned(),
            "get_chunk".to_owned(),
            1,
            1,
        ),
        (
            "token".to_owned(),
            token_id.clone(),
            "bob".to_owned(),
            "search".to_owned(),
            4,
            4,
        ),
    ];
    assert_eq!(summary(&cli_rows(&app, &s.lib_c, Some(&olga))), want);
    // every row names its hour; the query text is not kept by default
    for r in cli_rows(&app, &s.lib_c, Some(&olga)) {
        assert!(r["hour"].as_str().unwrap().ends_with(":00:00Z"), "{r}");
        assert!(r["query"].is_null(), "{r}");
    }
    // the owner does not see another library's reads: lib_a has bob's token only
    let (ok, _, err) = app.cli(&["audit", "library", &s.lib_a, "--as", &olga]);
    assert!(!ok);
    assert!(
        err.contains("only the library's owners and managers (and staff) may see who read library"),
        "{err}"
    );
    assert_eq!(
        summary(&cli_rows(&app, &s.lib_a, Some("bob"))),
        [(
            "token".to_owned(),
            token_id.clone(),
            "bob".to_owned(),
            "search".to_owned(),
            3,
            3
        )]
    );
    // the operator (no --as) and staff see every library's
    assert_eq!(summary(&cli_rows(&app, &s.lib_c, None)), want);
    staff(&app, "sam").await;
    assert_eq!(summary(&cli_rows(&app, &s.lib_c, Some("sam"))), want);

    // the console: the owner's page names the team by id and the token by id and user
    let mut c = Console::signed_in(&app, &olga, STAFF_PASSWORD).await;
    let me = c.get("/admin/me").await;
    assert!(
        me.body.contains("/admin/me/library/activity?uid="),
        "linked from the owner's page"
    );
    let page = c
        .get(&format!("/admin/me/library/activity?uid={}&since=1d", s.lib_c))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains(&team_s) && page.body.contains(&token_id) && page.body.contains("bob"));
    assert!(page.body.contains("<b>9</b> call(s)"), "{}", page.body);
    // beside the library's write events: its creation and its item's ingest
    let changes = &page.body[page.body.find("<h2>Changes</h2>").unwrap()..];
    assert!(
        changes.contains("library_created") && changes.contains("item_created"),
        "{changes}"
    );
    let refused = c.get(&format!("/admin/me/library/activity?uid={}", s.lib_a)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    // JSON lines for one library
    let lines = c
        .get(&format!("/admin/me/library/activity.jsonl?uid={}&since=1d", s.lib_c))
        .await;
    assert_eq!(lines.status, StatusCode::OK);
    let parsed: Vec<Value> = lines.body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(summary(&parsed), want);
    assert!(parsed.iter().all(|r| r["library_uid"] == s.lib_c.as_str()));
}

#[tokio::test]
async fn a_non_owner_is_refused_by_the_console_and_the_cli() {
    let app = TestApp::spawn_with(|s| s.usage_flush_secs = 3600).await;
    let s = seed(&app).await;
    let rita = person(&app, "rita").await;
    // a reader of the library is not an owner or manager
    users::grant(&app.pg, &rita, &s.lib_c, Role::Reader).await.unwrap();
    let token = app.opaque_token(&[s.lib_c.clone()]).await;
    app.mcp(&token)
        .connect()
        .await
        .call_ok("search", json!({"query": "zanzibarine"}))
        .await;
    app.state.metrics.activity.flush(&app.pg).await;
    let (ok, out, err) = app.cli(&["audit", "library", &s.lib_c, "--as", &rita]);
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!(
            "only the library's owners and managers (and staff) may see who read library {}",
            s.lib_c
        )),
        "{err}"
    );
    let (ok, _, err) = app.cli(&["audit", "library", &s.lib_c, "--as", "nobody"]);
    assert!(!ok && err.contains("no such user: nobody"), "{err}");
    let mut c = Console::signed_in(&app, &rita, STAFF_PASSWORD).await;
    for path in [
        format!("/admin/me/library/activity?uid={}", s.lib_c),
        format!("/admin/me/library/activity.jsonl?uid={}", s.lib_c),
        format!("/admin/me/library/activity?uid={}", app.uid("no_such_library")),
    ] {
        let r = c.get(&path).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        assert!(!r.body.contains("token"), "nothing of the rows leaks: {}", r.body);
    }
    // signed out: to the sign-in page
    let r = Console::new(&app)
        .get(&format!("/admin/me/library/activity?uid={}", s.lib_c))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn counts_survive_a_replica_restart_up_to_the_last_flush() {
    // Flushed every second (MNEMOSYNE_USAGE_FLUSH_SECS), and once more when a
    // replica stops: a replica that dies loses at most one interval.
    let app = TestApp::spawn_with(|s| s.usage_flush_secs = 1).await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_c.clone()]).await;
    let calls = |rows: &[Value]| rows.iter().map(|r| r["calls"].as_i64().unwrap()).sum::<i64>();
    let wait_for = |n: i64| {
        let app = &app;
        let lib = s.lib_c.clone();
        async move {
            for _ in 0..100 {
                if calls(&cli_rows(app, &lib, None)) == n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("activity never reached {n} calls");
        }
    };
    let replica = app.second_instance().await;
    let mut c = replica.mcp(&token).stateless();
    for _ in 0..2 {
        c.call_ok("search", json!({"query": "zanzibarine"})).await;
    }
    // the periodic flush, without anyone asking
    wait_for(2).await;
    drop(c);
    drop(replica);
    let replica = app.second_instance().await;
    let mut c = replica.mcp(&token).stateless();
    c.call_ok("search", json!({"query": "zanzibarine"})).await;
    wait_for(3).await;
    // a replica that stops flushes what it holds
    let slow = app
        .replica_with({
            let mut st = app.settings.clone();
            st.usage_flush_secs = 3600;
            st
        })
        .await;
    slow.mcp(&token)
        .stateless()
        .call_ok("search", json!({"query": "zanzibarine"}))
        .await;
    drop(slow);
    wait_for(4).await;
    let rows = cli_rows(&app, &s.lib_c, None);
    assert_eq!(rows.len(), 1, "one row per hour, reader and tool: {rows:?}");
    assert_eq!(
        (rows[0]["calls"].as_i64(), rows[0]["results"].as_i64()),
        (Some(4), Some(4))
    );
}

#[tokio::test]
async fn the_operator_may_keep_a_hash_or_the_text_of_each_query() {
    for (mode, want) in [
        (mnemosyne::activity::QueryMode::Hash, None),
        (mnemosyne::activity::QueryMode::Text, Some("zanzibarine")),
    ] {
        let app = TestApp::spawn_with(|s| {
            s.usage_flush_secs = 3600;
            s.activity_query = mode;
        })
        .await;
        let s = seed(&app).await;
        let token = app.opaque_token(&[s.lib_c.clone()]).await;
        app.mcp(&token)
            .connect()
            .await
            .call_ok("search", json!({"query": "zanzibarine"}))
            .await;
        app.state.metrics.activity.flush(&app.pg).await;
        let rows = cli_rows(&app, &s.lib_c, None);
        let q = rows[0]["query"].as_str().unwrap();
        match want {
            Some(text) => assert_eq!(q, text),
            None => {
                use sha2::Digest;
                assert_eq!(q, hex::encode(sha2::Sha256::digest(b"zanzibarine")));
            }
        }
    }
}

#[tokio::test]
async fn activity_off_counts_nothing() {
    let app = TestApp::spawn_with(|s| {
        s.usage_flush_secs = 3600;
        s.library_activity = false;
    })
    .await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_c.clone()]).await;
    app.mcp(&token)
        .connect()
        .await
        .call_ok("search", json!({"query": "zanzibarine"}))
        .await;
    app.state.metrics.activity.flush(&app.pg).await;
    assert!(cli_rows(&app, &s.lib_c, None).is_empty());
}
