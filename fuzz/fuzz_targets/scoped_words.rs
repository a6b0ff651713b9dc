#![no_main]
//! The keyed-word builder of `scoped` (src/store/graph/scoped.rs): `words`,
//! `scoped_text`, `query_words`, `scoped_queries`.
//!
//! Input: library uids and a text, separated by NUL bytes (`lib1\0lib2\0text`).
//!
//! Properties:
//! - every word is non-empty `[a-z0-9]`, at most 120 characters;
//! - every `scoped` token is `<library key>_<word>`, only `[a-z0-9_]`: one
//!   analyzer token, nothing the query parser could read as syntax;
//! - query words are distinct, at most 64, and contain no Lucene syntax character
//!   (nor an upper-case operator such as AND / OR / NOT);
//! - a query for a text's own words asks for tokens its `scoped` text contains
//!   (index and query tokenise alike);
//! - `scoped_queries` covers every library once, in order, each query
//!   `+scoped:(…)` of `<key>_<word>` terms only, within the clause cap.
use libfuzzer_sys::fuzz_target;
use mnemosyne::store::graph::scoped::{
    library_key, query_words, scoped_queries, scoped_text, words, MAX_CLAUSES, MAX_QUERY_WORDS,
};

fn plain(w: &str) -> bool {
    !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn token(t: &str) -> bool {
    !t.is_empty()
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else { return };
    let mut parts: Vec<&str> = input.split('\0').collect();
    let text = parts.pop().unwrap_or("");
    let libs: Vec<String> = parts.iter().map(|s| s.to_string()).collect();

    let ws: Vec<String> = words(text).collect();
    for w in &ws {
        assert!(plain(w) && w.chars().count() <= 120, "word {w:?}");
    }

    let qs = query_words(text);
    assert!(qs.len() <= MAX_QUERY_WORDS);
    let mut seen = std::collections::HashSet::new();
    for q in &qs {
        assert!(seen.insert(q), "repeated query word {q:?}");
        assert!(plain(q));
        assert!(!q.contains(|c: char| "+-&|!(){}[]^\"~*?:\\/ \t\n".contains(c)));
        assert!(!["AND", "OR", "NOT", "TO"].contains(&q.as_str()));
    }
    // Query words are the text's first distinct words.
    let mut distinct = Vec::new();
    for w in &ws {
        if !distinct.contains(w) {
            distinct.push(w.clone());
        }
    }
    distinct.truncate(MAX_QUERY_WORDS);
    assert_eq!(qs, distinct);

    for lib in libs.iter().take(3) {
        let key = library_key(lib);
        assert!(key.len() == 11 && token(&key));
        let s = scoped_text(lib, text);
        let toks: Vec<&str> = if s.is_empty() { vec![] } else { s.split(' ').collect() };
        assert_eq!(toks.len(), ws.len(), "one token per word");
        for (t, w) in toks.iter().zip(&ws) {
            assert!(token(t), "token {t:?}");
            assert_eq!(
                t.strip_prefix(key.as_str()).and_then(|r| r.strip_prefix('_')),
                Some(w.as_str())
            );
        }
        for q in &qs {
            assert!(toks.contains(&format!("{key}_{q}").as_str()));
        }
    }

    let batches = scoped_queries(&libs, &qs);
    if libs.is_empty() || qs.is_empty() {
        assert!(batches.is_empty());
        return;
    }
    let covered: Vec<&String> = batches.iter().flat_map(|(b, _)| b.iter()).collect();
    assert_eq!(covered, libs.iter().collect::<Vec<_>>());
    for (batch, query) in &batches {
        let inner = query
            .strip_prefix("+scoped:(")
            .and_then(|q| q.strip_suffix(')'))
            .expect("query shape");
        let terms: Vec<&str> = inner.split(' ').collect();
        assert_eq!(terms.len(), batch.len() * qs.len());
        assert!(terms.len() <= MAX_CLAUSES);
        for (i, t) in terms.iter().enumerate() {
            let (lib, w) = (&batch[i / qs.len()], &qs[i % qs.len()]);
            assert_eq!(*t, format!("{}_{w}", library_key(lib)));
            assert!(token(t));
        }
    }
});
