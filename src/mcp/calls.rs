//! How a tool call is counted, in one place: the guard (rate limited, a
//! `tools/call` of no tool of ours), the server (a tool the credential may
//! not use) and the call itself (`ok`, `tool_error`) all end here, so the
//! Prometheus series and the per-credential usage rows cannot disagree.

use crate::auth::Principal;
use crate::metrics::Metrics;

/// How a `tools/call` ended: the `outcome` label of `mcp_tool_calls_total`
/// and of the usage rows (see `Metrics::tool_calls`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// An `isError` answer: bad argument, not found, store down, deadline.
    ToolError,
    /// Rate limited before it ran, or not available to the credential.
    Refused,
    /// A `tools/call` of no tool of ours (rmcp answers it).
    ProtocolError,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::Refused => "refused",
            Outcome::ProtocolError => "protocol_error",
        }
    }
}

/// The label a called name is counted under: one of `TOOLS`, else `other`,
/// so no caller-chosen string becomes a label, a bucket or a usage row.
pub fn tool_label(name: &str) -> &'static str {
    super::TOOLS.iter().find(|t| **t == name).copied().unwrap_or("other")
}

/// Counts one tool call: `mcp_tool_calls_total{tool,outcome}` and, when the
/// caller is known (always, behind the guard), its usage row. `tool` is one
/// of `TOOLS` or `other` (see [`tool_label`]).
pub fn record_call(metrics: &Metrics, principal: Option<&Principal>, tool: &'static str, outcome: Outcome) {
    let outcome = outcome.as_str();
    metrics.tool_calls.with_label_values(&[tool, outcome]).inc();
    if let Some(p) = principal {
        metrics
            .usage
            .record(p.kind().as_str(), p.subject(), p.libraries().len(), tool, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_tool_names_become_labels() {
        for t in super::super::TOOLS {
            assert_eq!(tool_label(t), t);
        }
        assert_eq!(tool_label("Search"), "other");
        assert_eq!(tool_label(""), "other");
        assert_eq!(tool_label("other"), "other");
    }

    #[test]
    fn a_call_is_counted_once_under_its_tool_and_outcome() {
        let m = Metrics::new();
        record_call(&m, None, "search", Outcome::Refused);
        record_call(&m, None, "other", Outcome::ProtocolError);
        assert_eq!(m.tool_calls.with_label_values(&["search", "refused"]).get(), 1);
        assert_eq!(m.tool_calls.with_label_values(&["other", "protocol_error"]).get(), 1);
        assert_eq!(m.tool_calls.with_label_values(&["search", "ok"]).get(), 0);
    }
}
