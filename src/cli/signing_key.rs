//! `mnemosyne signing-key create|list|retire`: JWT signing keys.

use anyhow::bail;

use super::args::KeyCmd;
use super::{emit, CLI_ACTOR};
use crate::service;
use crate::store::pg::keys;

/// `signing-key create|list|retire`.
pub(super) async fn run(pool: &sqlx::PgPool, c: KeyCmd, json: bool) -> anyhow::Result<()> {
    match c {
        KeyCmd::Create => {
            let k = service::keys::create(pool, CLI_ACTOR).await?;
            emit(json, serde_json::json!({"kid": k.kid, "secret": k.secret_hex}), || {
                println!(
                    "kid:    {}\nsecret: {}\n(the secret is shown once)",
                    k.kid, k.secret_hex
                )
            });
        }
        KeyCmd::List => {
            let list = keys::list(pool).await?;
            let value = list
                .iter()
                .map(|k| serde_json::json!({"kid": k.kid, "created_at": k.created_at, "retired_at": k.retired_at}))
                .collect();
            emit(json, value, || {
                println!("{:<24} {:<27} RETIRED", "KID", "CREATED");
                for k in &list {
                    println!(
                        "{:<24} {:<27} {}",
                        k.kid,
                        k.created_at.to_rfc3339(),
                        k.retired_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "-".into())
                    );
                }
            });
        }
        KeyCmd::Retire { kid } => {
            if !service::keys::retire(pool, CLI_ACTOR, &kid).await? {
                bail!("no active key with kid {kid}");
            }
            emit(json, serde_json::json!({"kid": kid, "retired": true}), || {
                println!("key {kid} retired; JWTs signed with it are refused from the next request")
            });
        }
    }
    Ok(())
}
