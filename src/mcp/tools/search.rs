//! `search`: full-text search over the chunks of the caller's libraries.

use http::request::Parts;
use rmcp::{
    handler::server::tool::{schema_for_output, Extension},
    model::{CallToolResult, JsonObject},
    service::RequestContext,
    tool, tool_router, ErrorData as McpError, RoleServer,
};
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::{int, null_is_absent, opt_uid, parse, text, ArgError, Len, Range, ToolArgs, UID};
use super::tool_body;
use super::{input_schema, tally, Reply, ToolError};
use crate::mcp::{KnowledgeServer, ToolState};
use crate::search::engine::{Floor, Mode, Reranking, Search, SearchHit, Signal, MAX_QUERY_CHARS};
use crate::search::fusion::default_min_relevance;
use crate::store::graph::knowledge::ScopedGraph;
use crate::store::graph::GraphError;
use crate::text::inline;

const QUERY: Len = Len {
    min: 1,
    max: MAX_QUERY_CHARS,
};
const LIMIT: Range = Range {
    min: 1,
    max: 50,
    default: 10,
};
const LIBRARY_UIDS: usize = 1000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = null_is_absent)]
pub struct SearchArgs {
    /// Plain text to look for (no query syntax: * and ? are ordinary characters)
    #[schemars(length(min = QUERY.min, max = QUERY.max))]
    pub query: String,
    #[schemars(range(min = LIMIT.min, max = LIMIT.max), extend("default" = LIMIT.default))]
    pub limit: Option<i64>,
    /// Only these libraries (narrows the caller's libraries, never widens)
    #[schemars(
        length(max = LIBRARY_UIDS),
        inner(length(min = UID.min, max = UID.max)),
        transform = library_uid_items
    )]
    pub library_uids: Option<Vec<String>>,
    /// Only this collection
    #[schemars(length(min = UID.min, max = UID.max))]
    pub collection_uid: Option<String>,
    /// Leave out results whose relevance is below this (0–1); give 0 to see
    /// every candidate. Default in hybrid mode: no results when none reaches
    /// 0.35 (0.3 on a server with one embedding model; the libraries most
    /// likely hold nothing on the question),
    /// otherwise every result something supports (relevance above 0). In
    /// keyword and semantic mode: 0
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_relevance: Option<f64>,
    /// hybrid (keyword and semantic results fused; the default when the
    /// server has an embedding model), keyword (words), or semantic (meaning)
    pub mode: Option<Mode>,
}

/// Each entry of `library_uids` says what it is.
fn library_uid_items(schema: &mut Schema) {
    if let Some(items) = schema.get_mut("items").and_then(Value::as_object_mut) {
        items.insert("description".into(), "Library uid".into());
    }
}

impl ToolArgs for SearchArgs {
    /// `limit`, defaulted.
    type Checked = i64;

    fn check(&self) -> Result<i64, ArgError> {
        text("query", &self.query, QUERY)?;
        let limit = int("limit", self.limit, LIMIT)?;
        if let Some(uids) = &self.library_uids {
            if uids.len() > LIBRARY_UIDS {
                return Err(ArgError::new(
                    "library_uids",
                    format!("must have at most {LIBRARY_UIDS} entries"),
                ));
            }
            if uids.iter().any(|u| !crate::ids::is_uid(u)) {
                return Err(ArgError::new(
                    "library_uids",
                    format!("must be a list of library uids ({})", crate::ids::Uid::RULE),
                ));
            }
        }
        if let Some(r) = self.min_relevance {
            if !(0.0..=1.0).contains(&r) {
                return Err(ArgError::new("min_relevance", "must be a number from 0 to 1"));
            }
        }
        opt_uid("collection_uid", &self.collection_uid)?;
        Ok(limit)
    }
}

#[derive(Serialize, JsonSchema)]
pub struct SearchOut {
    pub results: Vec<SearchHit>,
    /// Set when the search is not the one asked for: a hybrid search whose
    /// query the embedding provider could not embed in time answers from
    /// keyword search alone, and a hybrid or semantic search the server's
    /// reranker could not reorder (it did not answer in time, or answered
    /// wrongly) keeps search's own order and scores; each says so here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What a hybrid search answers when its query has no vector.
const KEYWORDS_ONLY: &str =
    "semantic search is unavailable right now (the embedding provider did not answer in time): these results are from keyword search alone";

/// What a hybrid or semantic search answers when the reranker could not
/// reorder it.
const NOT_RERANKED: &str =
    "the reranker is unavailable right now (it did not answer in time, or its answer was refused): these results keep search's own order and scores, not reranked";

#[tool_router(router = search_router, vis = "pub(crate)")]
impl KnowledgeServer {
    #[tool(
        description = "Search the chunks of the libraries you may read. `mode`: hybrid (words and meaning fused; the default when the server has an embedding model), keyword (words; titles included; case, accents and word endings do not matter) or semantic (meaning: finds paraphrases that share no word); get_health lists the modes this server offers. Returns the best-matching chunks with their library (uid and name), collection and item uids, the item's source_uri, mime_type and updated_at (to cite), a score, a relevance from 0 to 1 (how strongly the words or the meaning support the hit) and which searches found each. Hybrid search returns nothing when no hit reaches relevance 0.35 (0.3 on a server with one embedding model), which means the libraries most likely hold nothing on the question; otherwise it returns the best hits, weaker ones after with their lower relevance (`min_relevance` instead leaves out every hit below the value you give). A query with nothing to search returns nothing in every mode: one of punctuation, operators or spaces alone (`*`, `?`, `()` match no word and are no wildcard), or one whose every word the embedding model cannot read (a random identifier such as `a1b50dd5f6`) when no word of it occurs in the libraries searched. On a server with a reranker, the best hybrid and semantic hits are ordered by the reranker's score (their `score`; their relevance, and what `min_relevance` and the 0.35 threshold keep, stay the search's own); when it cannot answer, the results keep the search's order and `note` says so.",
        input_schema = input_schema::<SearchArgs>(),
        output_schema = schema_for_output::<SearchOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn search(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        tool_body!(self, ctx, parts, args, search)
    }
}

async fn call(tools: &ToolState, graph: ScopedGraph, args: JsonObject) -> Result<Reply, ToolError> {
    let engine = tools.search();
    let (a, limit): (SearchArgs, i64) = parse(args)?;
    let semantic = engine.has_semantic();
    let mode = match a.mode {
        Some(m @ (Mode::Semantic | Mode::Hybrid)) if !semantic => {
            return Err(ArgError::new(
                "mode",
                format!(
                    "`{}` is not available: this server has no embedding model (available: keyword)",
                    mode_name(m)
                ),
            )
            .into());
        }
        Some(m) => m,
        None if semantic => Mode::Hybrid,
        None => Mode::Keyword,
    };
    let graph = match &a.library_uids {
        Some(only) => graph.narrow(only),
        None => graph,
    };
    let floor = match (a.min_relevance, mode) {
        (Some(min), _) => Floor::Hit(min),
        (None, Mode::Hybrid) => Floor::Answer(default_min_relevance(engine.is_paired())),
        (None, Mode::Keyword | Mode::Semantic) => Floor::Hit(0.0),
    };
    let search = Search {
        text: &a.query,
        limit: limit as usize,
        collection_uid: a.collection_uid.as_deref(),
        floor,
        mode,
    };
    // Keyword search alone, as the caller would have asked for it.
    let keywords = Search {
        mode: Mode::Keyword,
        floor: Floor::Hit(a.min_relevance.unwrap_or(0.0)),
        ..search
    };
    // A hybrid search whose query cannot be embedded (the provider's
    // circuit open: at once; else after the query timeout) answers from
    // keywords and says so; a semantic one is an error.
    let (hits, note, mode) = match mode {
        Mode::Hybrid if !engine.embedding_available() => {
            (engine.run(&graph, &keywords).await?, Some(KEYWORDS_ONLY), Mode::Keyword)
        }
        _ => match engine.answer(&graph, &search).await {
            Ok(a) => match a.reranking {
                Reranking::Kept(_) => (a.hits, Some(NOT_RERANKED), mode),
                Reranking::NotAsked | Reranking::Reordered => (a.hits, None, mode),
            },
            Err(GraphError::Embedding(_)) if mode == Mode::Hybrid => {
                (engine.run(&graph, &keywords).await?, Some(KEYWORDS_ONLY), Mode::Keyword)
            }
            Err(e) => return Err(e.into()),
        },
    };
    let mut text = format!(
        "{} result(s) for \"{}\" ({} search)",
        hits.len(),
        a.query,
        mode_name(mode)
    );
    for (i, h) in hits.iter().enumerate() {
        let found: Vec<&str> = h
            .found_by
            .iter()
            .map(|s| match s {
                Signal::Keyword => "keyword",
                Signal::Semantic => "semantic",
            })
            .collect();
        let source = match &h.source_uri {
            Some(uri) => format!("; source {}", inline(uri)),
            None => String::new(),
        };
        text.push_str(&format!(
            "\n\n{}. {} (score {:.3}; relevance {:.2}; found by {}; chunk {} #{}; item {}; collection {}; library {} \"{}\"{}{})\n{}",
            i + 1,
            inline(&h.item_title),
            h.score,
            h.relevance,
            found.join("+"),
            h.chunk_uid,
            h.ordinal,
            h.item_uid,
            h.collection_uid,
            h.library_uid,
            inline(&h.library_name),
            source,
            h.updated_at
                .as_deref()
                .map(|u| format!("; updated {}", inline(u)))
                .unwrap_or_default(),
            snippet(&h.text, 400)
        ));
    }
    if let Some(n) = note {
        text.push_str(&format!("\n\nNote: {n}."));
    }
    let reads = tally(hits.iter().map(|h| h.library_uid.as_str()));
    let reply = Reply::structured(
        &SearchOut {
            results: hits,
            note: note.map(str::to_owned),
        },
        text,
    )?;
    Ok(reply.reading(reads).for_query(&a.query))
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Hybrid => "hybrid",
        Mode::Keyword => "keyword",
        Mode::Semantic => "semantic",
    }
}

/// The first `n` characters of `text` with its whitespace collapsed, and `…`
/// when cut.
fn snippet(text: &str, n: usize) -> String {
    let mut out = String::with_capacity(n.min(text.len()) + 4);
    for (count, word) in text.split_whitespace().enumerate() {
        if count > 0 {
            out.push(' ');
        }
        out.push_str(word);
        if out.len() >= n {
            let cut = out.char_indices().nth(n).map(|(i, _)| i).unwrap_or(out.len());
            out.truncate(cut);
            out.push('…');
            break;
        }
    }
    out
}
