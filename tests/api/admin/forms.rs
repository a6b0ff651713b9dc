//! Console forms: the switch field, the one-time `once` value, oversized bodies.

use super::*;

#[tokio::test]
async fn a_switch_field_other_than_on_or_off_is_a_400_naming_it_and_changes_nothing() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    person(&app, "pat").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    for (path, field) in [("/admin/users/active", "active"), ("/admin/users/staff", "staff")] {
        let r = c.post(path, &[("username", "pat"), (field, "true")]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(r.body.contains(&format!("{field} must be on or off")), "{}", r.body);
    }
    let pat = users::by_username(&app.pg, "pat").await.unwrap().unwrap();
    assert!(pat.active && !pat.is_staff);
    let r = c.post("/admin/tokens/revoke", &[("id", "not-a-number")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("id must be a token id"), "{}", r.body);
}

/// The value of the first `name="once"` hidden field.
fn once_in(html: &str) -> String {
    let at = html.find("name=\"once\" value=\"").expect("a once field") + "name=\"once\" value=\"".len();
    html[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn reloading_a_result_page_does_not_create_a_key_or_rotate_a_team_twice() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let keys_before: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_signing_keys")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    let page = c.get("/admin/keys").await;
    let once = once_in(&page.body);
    let csrf = c.csrf.clone();
    // The browser sends the form; then a reload sends exactly the same body.
    let first = c.post_raw("/admin/keys", &[("csrf", &csrf), ("once", &once)]).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let again = c.post_raw("/admin/keys", &[("csrf", &csrf), ("once", &once)]).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert!(again.body.contains("already submitted"), "{}", again.body);
    let keys_after: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_signing_keys")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(keys_after, keys_before + 1, "one key, not two");
    // A rotation: the JWT shown by the first answer stays the team's JWT.
    let (team, _) = app.create_team("Reloaded").await;
    let detail = c.get(&format!("/admin/teams/{team}")).await;
    let once = once_in(&detail.body);
    let csrf = c.csrf.clone();
    let path = format!("/admin/teams/{team}/rotate");
    let rotated = c.post_raw(&path, &[("csrf", &csrf), ("once", &once)]).await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    let jwt = jwt_in(&rotated.body).expect("the new JWT on the result page");
    assert_eq!(
        c.post_raw(&path, &[("csrf", &csrf), ("once", &once)]).await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(app.mcp(&jwt).initialize().await.status, StatusCode::OK);
    // A fresh form (the page opened again) works as before.
    let detail = c.get(&format!("/admin/teams/{team}")).await;
    let once = once_in(&detail.body);
    let csrf = c.csrf.clone();
    assert_eq!(
        c.post_raw(&path, &[("csrf", &csrf), ("once", &once)]).await.status,
        StatusCode::OK
    );
}

/// Hardening 3, row 4: a signed-in person posting a 4 MiB form of distinct
/// `library=` values gets a prompt 400 naming `libraries` (a cap checked
/// before any per-value work), and the server keeps answering meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_four_mib_library_form_is_a_fast_400_and_healthz_keeps_answering() {
    let app = TestApp::spawn().await;
    let a = app.library("mine").await;
    person(&app, "pat").await;
    users::grant(&app.pg, "pat", &a, Role::Owner).await.unwrap();
    let mut c = Console::signed_in(&app, "pat", STAFF_PASSWORD).await;
    let values: Vec<String> = (0..170_000).map(|i| format!("lib_{i:08}x")).collect();
    let mut fields: Vec<(&str, &str)> = vec![("name", "flood")];
    fields.extend(values.iter().map(|v| ("library", v.as_str())));
    let done = Arc::new(AtomicBool::new(false));
    let probe = {
        let (http, url, done) = (app.http.clone(), app.url("/healthz"), done.clone());
        tokio::spawn(async move {
            let mut answered = 0;
            // Bounded: at most 600 probes (60 s).
            for _ in 0..600 {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                let r = tokio::time::timeout(Duration::from_secs(1), http.get(&url).send()).await;
                assert!(
                    matches!(r, Ok(Ok(ref r)) if r.status().is_success()),
                    "healthz did not answer within 1 s"
                );
                answered += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answered
        })
    };
    let r = c.post("/admin/me/tokens", &fields).await;
    done.store(true, Ordering::SeqCst);
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "{}",
        &r.body[..r.body.len().min(300)]
    );
    assert!(r.body.contains("libraries"), "names the field");
    assert!(probe.await.unwrap() >= 1);
}
