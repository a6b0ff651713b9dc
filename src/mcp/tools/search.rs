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

impl SearchOut {
    /// The structured result, exactly as `serde_json::to_value` writes it
    /// (the published output schema is this type's), the hits' strings moved
    /// into it rather than copied: this runs for every search, and copying
    /// every field of every hit was a visible share of a light query's cost
    /// (docs/performance.md).
    fn into_value(self) -> Value {
        let results = self.results.into_iter().map(hit_value).collect();
        let mut out = serde_json::Map::new();
        out.insert("results".into(), Value::Array(results));
        if let Some(note) = self.note {
            out.insert("note".into(), Value::String(note));
        }
        Value::Object(out)
    }
}

/// A hit as `serde_json::to_value` writes it, its strings moved.
fn hit_value(h: SearchHit) -> Value {
    let SearchHit {
        chunk_uid,
        item_uid,
        item_title,
        collection_uid,
        library_uid,
        library_name,
        source_uri,
        mime_type,
        updated_at,
        ordinal,
        score,
        relevance,
        similarity,
        found_by,
        text,
    } = h;
    let found_by = found_by
        .into_iter()
        .map(|s| Value::String(signal_name(s).into()))
        .collect();
    let mut m = serde_json::Map::new();
    for (key, value) in [
        ("chunk_uid", Value::String(chunk_uid)),
        ("item_uid", Value::String(item_uid)),
        ("item_title", Value::String(item_title)),
        ("collection_uid", Value::String(collection_uid)),
        ("library_uid", Value::String(library_uid)),
        ("library_name", Value::String(library_name)),
        ("source_uri", source_uri.map_or(Value::Null, Value::String)),
        ("mime_type", mime_type.map_or(Value::Null, Value::String)),
        ("updated_at", updated_at.map_or(Value::Null, Value::String)),
        ("ordinal", Value::from(ordinal)),
        ("score", Value::from(score)),
        ("relevance", Value::from(relevance)),
        ("similarity", similarity.map_or(Value::Null, Value::from)),
        ("found_by", Value::Array(found_by)),
        ("text", Value::String(text)),
    ] {
        m.insert(key.into(), value);
    }
    Value::Object(m)
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
        write_hit(&mut text, i + 1, h);
    }
    if let Some(n) = note {
        text.push_str(&format!("\n\nNote: {n}."));
    }
    let reads = tally(hits.iter().map(|h| h.library_uid.as_str()));
    let out = SearchOut {
        results: hits,
        note: note.map(str::to_owned),
    };
    let reply = Reply::structured_value(out.into_value(), text);
    Ok(reply.reading(reads).for_query(&a.query))
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Hybrid => "hybrid",
        Mode::Keyword => "keyword",
        Mode::Semantic => "semantic",
    }
}

/// A signal's name, as `Signal`'s serde name (`rename_all = "lowercase"`)
/// writes it: in the text block and the structured result alike.
fn signal_name(s: Signal) -> &'static str {
    match s {
        Signal::Keyword => "keyword",
        Signal::Semantic => "semantic",
    }
}

/// Hit `number`'s entry in the text block: a line of what it is and where it
/// comes from, then the start of its text (`push_snippet`). Written into
/// `out` as it goes: this runs for every hit of every search.
fn write_hit(out: &mut String, number: usize, h: &SearchHit) {
    use std::fmt::Write;
    let _ = write!(
        out,
        "\n\n{number}. {} (score {:.3}; relevance {:.2}; found by ",
        inline(&h.item_title),
        h.score,
        h.relevance
    );
    for (j, s) in h.found_by.iter().enumerate() {
        if j > 0 {
            out.push('+');
        }
        out.push_str(signal_name(*s));
    }
    let _ = write!(
        out,
        "; chunk {} #{}; item {}; collection {}; library {} \"{}\"",
        h.chunk_uid,
        h.ordinal,
        h.item_uid,
        h.collection_uid,
        h.library_uid,
        inline(&h.library_name)
    );
    if let Some(uri) = &h.source_uri {
        let _ = write!(out, "; source {}", inline(uri));
    }
    if let Some(u) = &h.updated_at {
        let _ = write!(out, "; updated {}", inline(u));
    }
    out.push_str(")\n");
    push_snippet(out, &h.text, 400);
}

/// Appends the start of `text` with its whitespace collapsed (each run of
/// `char::is_whitespace` characters between two words one space, none at
/// either end): words are added until the snippet holds `n` bytes or more;
/// then it is cut to at most `n` characters and `…` follows (so a text that
/// just reaches `n` bytes ends in `…` too, and one in a script of 3-byte
/// characters keeps about `n / 3`; as the tool has always written it).
/// Words are found byte by byte, ASCII bytes without decoding (the same words
/// as `str::split_whitespace`, which decodes every character).
fn push_snippet(out: &mut String, text: &str, n: usize) {
    let start = out.len();
    out.reserve(n.min(text.len()) + 4);
    let bytes = text.as_bytes();
    // The width of the whitespace character at `i`, or 0.
    let space_at = |i: usize| -> usize {
        let b = bytes[i];
        if b < 0x80 {
            return usize::from(matches!(b, b' ' | b'\t'..=b'\r'));
        }
        match text[i..].chars().next() {
            Some(c) if c.is_whitespace() => c.len_utf8(),
            _ => 0,
        }
    };
    let mut i = 0;
    loop {
        while i < bytes.len() {
            match space_at(i) {
                0 => break,
                w => i += w,
            }
        }
        if i >= bytes.len() {
            return;
        }
        let word = i;
        while i < bytes.len() && space_at(i) == 0 {
            i += if bytes[i] < 0x80 {
                1
            } else {
                text[i..].chars().next().map_or(1, char::len_utf8)
            };
        }
        if out.len() > start {
            out.push(' ');
        }
        out.push_str(&text[word..i]);
        if out.len() - start >= n {
            let cut = out[start..]
                .char_indices()
                .nth(n)
                .map_or(out.len(), |(at, _)| start + at);
            out.truncate(cut);
            out.push('…');
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `push_snippet` replaced (and must write to the byte): the words
    /// of `str::split_whitespace`, joined by one space, until `n` bytes.
    fn snippet_by_split_whitespace(text: &str, n: usize) -> String {
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

    #[test]
    fn the_snippet_is_split_whitespaces_words_to_the_byte() {
        // Every kind of whitespace Rust knows (ASCII and not), characters
        // beside them that are not whitespace (U+001C, U+200B, NBSP's
        // neighbours), and words of 1–4 byte characters.
        let pieces = [
            "a",
            "word",
            "é",
            "Größe",
            "中文",
            "🙂",
            "x\u{200b}y",
            "\u{1c}",
            "\u{8}",
            "\u{e}",
            "\u{a1}",
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            "\u{b}",
            "\u{c}",
            "\u{85}",
            "\u{a0}",
            "\u{1680}",
            "\u{2000}",
            "\u{200a}",
            "\u{2028}",
            "\u{2029}",
            "\u{202f}",
            "\u{205f}",
            "\u{3000}",
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for case in 0..3000 {
            let mut text = String::new();
            for _ in 0..(case % 80) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push_str(pieces[(x % pieces.len() as u64) as usize]);
            }
            for n in [0, 1, 3, 7, 20, 60, 400] {
                let mut out = String::from("prefix\n");
                push_snippet(&mut out, &text, n);
                assert_eq!(
                    out,
                    format!("prefix\n{}", snippet_by_split_whitespace(&text, n)),
                    "{text:?} n={n}"
                );
            }
        }
    }

    /// What `write_hit` replaced (and must write to the byte).
    fn hit_by_format(number: usize, h: &SearchHit) -> String {
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
        format!(
            "\n\n{}. {} (score {:.3}; relevance {:.2}; found by {}; chunk {} #{}; item {}; collection {}; library {} \"{}\"{}{})\n{}",
            number,
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
            snippet_by_split_whitespace(&h.text, 400)
        )
    }

    #[test]
    fn a_hits_entry_is_written_as_before() {
        let hit = SearchHit {
            chunk_uid: "c1".into(),
            item_uid: "i1".into(),
            item_title: "A title\nwith a newline".into(),
            collection_uid: "col".into(),
            library_uid: "lib".into(),
            library_name: "Docs \u{202e}".into(),
            source_uri: Some("https://example.org/a b".into()),
            mime_type: Some("text/plain".into()),
            updated_at: Some("2026-12-03T00:00:00Z".into()),
            ordinal: 7,
            score: 1.234_567,
            relevance: 0.5,
            similarity: Some(0.8),
            found_by: vec![Signal::Keyword, Signal::Semantic],
            text: "word ".repeat(120),
        };
        let variants = [
            hit.clone(),
            SearchHit {
                source_uri: None,
                updated_at: None,
                found_by: vec![Signal::Semantic],
                score: f64::NAN,
                text: "short\ttext".into(),
                ..hit.clone()
            },
            SearchHit {
                found_by: Vec::new(),
                text: String::new(),
                ..hit
            },
        ];
        for (i, h) in variants.iter().enumerate() {
            let mut out = String::new();
            write_hit(&mut out, i + 1, h);
            assert_eq!(out, hit_by_format(i + 1, h));
        }
    }

    #[test]
    fn the_structured_result_is_what_serde_writes() {
        let hit = SearchHit {
            chunk_uid: "c1".into(),
            item_uid: "i1".into(),
            item_title: "Title".into(),
            collection_uid: "col".into(),
            library_uid: "lib".into(),
            library_name: "Docs".into(),
            source_uri: Some("https://example.org/a".into()),
            mime_type: Some("text/markdown".into()),
            updated_at: Some("2026-12-03T00:00:00Z".into()),
            ordinal: -3,
            score: 1.25,
            relevance: 0.5,
            similarity: Some(0.8),
            found_by: vec![Signal::Keyword, Signal::Semantic],
            text: "text".into(),
        };
        let odd = SearchHit {
            source_uri: None,
            mime_type: None,
            updated_at: None,
            similarity: None,
            score: f64::NAN,
            relevance: f64::INFINITY,
            found_by: Vec::new(),
            ..hit.clone()
        };
        for note in [None, Some("a note".to_owned())] {
            let out = SearchOut {
                results: vec![hit.clone(), odd.clone()],
                note: note.clone(),
            };
            let by_serde = serde_json::to_value(&out).unwrap();
            assert_eq!(out.into_value(), by_serde, "{note:?}");
        }
    }
}
