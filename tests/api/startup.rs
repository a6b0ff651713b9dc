//! Start-up: a replica trusts its auth caches only once its heartbeat
//! registered it, and `serve` refuses a database that lacks migrations.

use std::sync::Arc;
use std::time::Duration;

use mnemosyne::auth::cache::{heartbeat, listen, AuthCaches};

use crate::helpers::TestApp;

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
    let listener = tokio::spawn(listen(app.pg.clone(), None, caches.clone()));
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
