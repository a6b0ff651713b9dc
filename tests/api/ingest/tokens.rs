//! Memberships and opaque tokens through the CLI.

use super::*;

#[tokio::test]
async fn token_create_needs_owner_or_manager_and_reader_is_refused() {
    let app = TestApp::spawn().await;
    let (a, b, c) = (app.uid("a"), app.uid("b"), app.uid("c"));
    assert!(app.cli(&["user", "create", "bob"]).0);
    assert!(app.cli(&["membership", "grant", "bob", &a, "owner"]).0);
    assert!(app.cli(&["membership", "grant", "bob", &b, "manager"]).0);
    assert!(app.cli(&["membership", "grant", "bob", &c, "reader"]).0);
    let (ok, out, _) = app.cli(&[
        "token",
        "create",
        "--user",
        "bob",
        "--library",
        &a,
        "--library",
        &b,
        "--name",
        "laptop",
    ]);
    assert!(ok);
    let plaintext = out.lines().last().unwrap().trim().to_owned();
    assert!(plaintext.starts_with("mnm_"));
    let (ok, _, err) = app.cli(&["token", "create", "--user", "bob", "--library", &a, "--library", &c]);
    assert!(!ok);
    assert!(err.contains(&c) && err.contains("not owner or manager"), "{err}");
    assert!(!err.contains(&format!("{a},")), "{err}");
    // list shows the token but never its hash or plaintext
    let (ok, list, _) = app.cli(&["token", "list"]);
    assert!(ok);
    assert!(list.contains("laptop") && list.contains(&format!("{a},{b}")));
    assert!(!list.contains(&plaintext) && !list.contains(&mnemosyne::auth::resolver::token_hash(&plaintext)));
    // membership list and revoke
    let (_, m, _) = app.cli(&["membership", "list", "--user", "bob"]);
    assert_eq!(m.lines().count(), 4, "{m}");
    assert!(app.cli(&["membership", "revoke", "bob", &c, "reader"]).0);
    assert!(!app.cli(&["membership", "revoke", "bob", &c, "reader"]).0);
    // revoke the token: refused on the next request
    let id = list
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(app.mcp(&plaintext).initialize().await.status, StatusCode::OK);
    assert!(app.cli(&["token", "revoke", &id]).0);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(app.mcp(&plaintext).initialize().await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn user_disable_via_cli_refuses_their_tokens() {
    let app = TestApp::spawn().await;
    let lib = app.uid("l");
    app.cli(&["user", "create", "carol"]);
    app.cli(&["membership", "grant", "carol", &lib, "owner"]);
    let (_, out, _) = app.cli(&["token", "create", "--user", "carol", "--library", &lib]);
    let plaintext = out.lines().last().unwrap().trim().to_owned();
    assert_eq!(app.mcp(&plaintext).initialize().await.status, StatusCode::OK);
    assert!(app.cli(&["user", "disable", "carol"]).0);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let ex = app.mcp(&plaintext).initialize().await;
    assert_eq!(ex.json()["error_description"], "User account is disabled.");
    let (ok, _, err) = app.cli(&["user", "disable", "nobody"]);
    assert!(!ok && err.contains("no such user"));
}
