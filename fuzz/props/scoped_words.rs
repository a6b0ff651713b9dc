//! The keyword index's terms (src/search/analysis.rs and scoped.rs):
//! `Analyzer::tokens`, `scoped_text`, `query_words`, `scoped_queries`.
//!
//! Input: library uids and a text, separated by NUL bytes (`lib1\0lib2\0text`);
//! the first byte of the text picks the library language.
//!
//! Properties:
//! - every token is non-empty `[a-z0-9]`, at most 120 characters;
//! - every `scoped` token is `<library key>_<term>` (text) or `<title key>_<term>`
//!   (title), only `[a-z0-9_]`: one analyzer token, nothing the query parser
//!   could read as syntax; `dl` counts the text's tokens;
//! - query terms are distinct, at most 64, and contain no Lucene syntax
//!   character (nor an upper-case operator such as AND / OR / NOT);
//! - a query for a text's own words asks for terms its `scoped` text contains
//!   (index and query analyse alike);
//! - `scoped_queries` covers every library once, in order, each query
//!   `+scoped:(…)` of a text and a title term per library and query term,
//!   within the clause cap.
use mnemosyne::analysis::scoped::{
    library_key, query_words, scoped_queries, scoped_text, title_key, MAX_CLAUSES, MAX_QUERY_WORDS,
};
use mnemosyne::analysis::{analyzer, detect, guess, LANGUAGES};

fn plain(w: &str) -> bool {
    !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn token(t: &str) -> bool {
    !t.is_empty()
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The target's body: libFuzzer's input, or one committed seed.
pub fn run(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else { return };
    let mut parts: Vec<&str> = input.split('\0').collect();
    let text = parts.pop().unwrap_or("");
    let libs: Vec<String> = parts.iter().map(|s| s.to_string()).collect();
    let language = LANGUAGES[text.bytes().next().unwrap_or(0) as usize % LANGUAGES.len()].0;

    // A chunk is analyzed in its own clear language, else the library's; a
    // query in the library's language and in the one it looks like.
    let indexed = detect(text).unwrap_or(language);
    let ws = analyzer(indexed).tokens(text);
    for w in &ws {
        assert!(plain(w) && w.chars().count() <= 120, "token {w:?}");
    }
    let mut query_tokens = analyzer(language).tokens(text);
    if let Some(g) = guess(text) {
        query_tokens.extend(analyzer(g).tokens(text));
        assert!(
            detect(text).is_none_or(|d| d == g),
            "a clear language is also the guess"
        );
    }

    let qs = query_words(language, text);
    assert!(qs.len() <= MAX_QUERY_WORDS);
    let mut seen = std::collections::HashSet::new();
    for q in &qs {
        assert!(seen.insert(q), "repeated query term {q:?}");
        assert!(plain(q));
        assert!(!q.contains(|c: char| "+-&|!(){}[]^\"~*?:\\/ \t\n".contains(c)));
        assert!(!["AND", "OR", "NOT", "TO"].contains(&q.as_str()));
        assert!(query_tokens.contains(q), "query term {q:?} is one of the text's tokens");
    }

    for lib in libs.iter().take(3) {
        let (key, tkey) = (library_key(lib), title_key(lib));
        assert!(key.len() == 11 && token(&key) && tkey.len() == 11 && token(&tkey));
        let s = scoped_text(lib, language, text, text);
        let toks: Vec<&str> = if s.scoped.is_empty() {
            vec![]
        } else {
            s.scoped.split(' ').collect()
        };
        assert_eq!(toks.len(), 2 * ws.len(), "one text and one title token per token");
        assert_eq!(s.dl as usize, ws.len());
        for (i, t) in toks.iter().enumerate() {
            assert!(token(t), "token {t:?}");
            let k = if i < ws.len() { &key } else { &tkey };
            assert_eq!(
                t.strip_prefix(k.as_str()).and_then(|r| r.strip_prefix('_')),
                Some(ws[i % ws.len()].as_str())
            );
        }
        // Every indexed token of a word the query keeps is asked for.
        assert!(qs.iter().any(|q| ws.contains(q)) || qs.is_empty() || ws.is_empty() || qs.len() == MAX_QUERY_WORDS);
        for q in qs.iter().filter(|q| ws.contains(q)) {
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
        assert_eq!(terms.len(), 2 * batch.len() * qs.len());
        assert!(terms.len() <= MAX_CLAUSES);
        for (i, t) in terms.iter().enumerate() {
            let (lib, w) = (&batch[i / (2 * qs.len())], &qs[(i / 2) % qs.len()]);
            let k = if i % 2 == 0 { library_key(lib) } else { title_key(lib) };
            assert_eq!(*t, format!("{k}_{w}"));
            assert!(token(t));
        }
    }
}
