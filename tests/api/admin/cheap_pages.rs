//! Console pages that stay cheap on a large graph (hardening 3, row 8): the
//! token picker reads only its own libraries, the libraries page is
//! paginated.

use mnemosyne::store::pg::users::{self, Role};
use reqwest::StatusCode;

use super::{person, staff, Console, STAFF_PASSWORD};
use crate::helpers::TestApp;

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
