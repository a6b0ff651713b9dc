//! `mnemosyne demo`: demo data and credentials (filled in with the ingest API).

use clap::Args;

use crate::config::Settings;

#[derive(Args, Debug)]
pub struct DemoArgs {}

pub async fn run(_settings: &Settings, _pool: &sqlx::PgPool, _args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("demo data needs the ingest API")
}
