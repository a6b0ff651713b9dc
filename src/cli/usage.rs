//! `mnemosyne usage`: tool calls per credential and per tool.

use super::emit;

/// Rows per credential kind in `mnemosyne usage`.
const USAGE_TOP: i64 = 50;

/// `usage [--days N]`: the busiest credentials of each kind, and every tool.
pub(super) async fn run(pool: &sqlx::PgPool, days: u32, json: bool) -> anyhow::Result<()> {
    use crate::store::pg::usage;
    let tokens = usage::top_credentials(pool, "token", days, USAGE_TOP).await?;
    let teams = usage::top_credentials(pool, "team", days, USAGE_TOP).await?;
    let per_turn = usage::top_credentials(pool, "per_turn", days, USAGE_TOP).await?;
    let tools = usage::by_tool(pool, days).await?;
    let value = serde_json::json!({"days": days, "tokens": tokens, "teams": teams, "per_turn": per_turn,
                                   "tools": tools});
    emit(json, value, || {
        println!("tool calls over the last {days} days");
        for (title, rows) in [("TOKENS", &tokens), ("TEAMS", &teams), ("PER-TURN", &per_turn)] {
            println!(
                "\n{title}\n{:<48} {:<24} {:>10} {:>10} {:>10}",
                "CREDENTIAL", "NAME", "CALLS", "REFUSED", "ERRORS"
            );
            for r in rows {
                println!(
                    "{:<48} {:<24} {:>10} {:>10} {:>10}",
                    r.credential,
                    r.name.as_deref().unwrap_or(""),
                    r.calls,
                    r.refused,
                    r.errors
                );
            }
        }
        println!(
            "\nTOOLS\n{:<20} {:>10} {:>10} {:>10}",
            "TOOL", "CALLS", "REFUSED", "ERRORS"
        );
        for t in &tools {
            println!("{:<20} {:>10} {:>10} {:>10}", t.tool, t.calls, t.refused, t.errors);
        }
    });
    Ok(())
}
