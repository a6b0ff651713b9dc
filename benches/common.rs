//! Shared set-up for benchmarks: a fresh database on the dev services.

use mnemosyne::config::Settings;
use mnemosyne::store::pg;

/// Settings pointing at a new, migrated database named `mnemosyne_bench_<tag>_<rand>`.
pub async fn fresh_settings(tag: &str) -> (Settings, sqlx::PgPool, String) {
    let mut s = Settings::from_env().expect("settings (run scripts/dev up)");
    let (server, _) = s.database_url.rsplit_once('/').expect("database URL");
    let admin = format!("{server}/postgres");
    let db = format!(
        "mnemosyne_bench_{tag}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let a = sqlx::PgPool::connect(&admin)
        .await
        .expect("Postgres reachable (run scripts/dev up)");
    sqlx::query(&format!("CREATE DATABASE \"{db}\""))
        .execute(&a)
        .await
        .unwrap();
    a.close().await;
    s.database_url = format!("{server}/{db}");
    s.listen = "127.0.0.1:0".parse().unwrap();
    let pool = pg::pool(&s.database_url, std::time::Duration::from_secs(5)).unwrap();
    pg::migrate(&pool).await.unwrap();
    pg::keys::ensure_active(&pool).await.unwrap();
    (s, pool, admin)
}

pub async fn drop_db(admin: &str, url: &str) {
    let db = url.rsplit_once('/').unwrap().1;
    if let Ok(a) = sqlx::PgPool::connect(admin).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"))
            .execute(&a)
            .await;
    }
}
