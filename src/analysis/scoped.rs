//! Scoped full-text terms: tenant isolation inside one shared full-text index.
//!
//! Measured on ArcadeDB: its full-text query reads every required term's whole
//! posting list before intersecting, so a `+library_uid:(…)` clause cannot stop
//! a tenant's search from slowing down as *other* tenants' corpora grow (p50
//! 1.6 → 9.5 → 250 ms at 2k / 20k / 200k foreign chunks). Instead every chunk
//! carries `scoped`: each of its terms prefixed with a short key of its library
//! (`k1a2b3c4d5e_tidal`), and its item title's terms under the title key
//! (`t1a2b3c4d5e_fundy`). A search asks only for its libraries' keyed terms, so
//! the posting lists it reads hold only its own chunks (p50 0.84 / 0.72 / 0.70
//! ms at the same sizes).
//!
//! The index only finds candidates: ranking is BM25 computed by the server
//! (`search::index::rank`) from each library's own statistics, because the
//! index's document count and average length are index-wide — with them, other
//! tenants' data moved a tenant's ranking.
//!
//! Terms are produced by `analysis`, never by the server's analyzer, so they
//! contain only `[a-z0-9_]` and survive analysis as one token; the user's
//! query goes through the same analysis, so no query syntax (`*`, `?`, `AND`,
//! quotes, `field:`) can ever reach the index.

use sha2::{Digest, Sha256};

use super::{self as analysis, analyzer, Language};

/// The analysis a chunk's `scoped` and `dl` were made with (`Chunk.analysis`):
/// `migrate` re-indexes every chunk made with an older one, and a replica
/// rebuilds a library index an older one made. 4: English stems respelled
/// after Snowball (`analysis::respell_english`, issue 51). 5: British
/// spellings written the American way before the stemmer
/// (`analysis::american_spelling`).
pub const ANALYSIS_VERSION: i64 = 5;

/// At most this many distinct terms of a query are searched.
pub const MAX_QUERY_WORDS: usize = 64;
/// Lucene caps boolean clauses at 1024; stay well below per query.
pub const MAX_CLAUSES: usize = 900;

fn key_hex(library_uid: &str) -> String {
    hex::encode(Sha256::digest(library_uid.as_bytes()))[..10].to_owned()
}

/// The library's key: `k` + 10 hex characters of SHA-256 of its uid. A
/// collision only costs speed: results are re-checked with `library_uid IN`.
pub fn library_key(library_uid: &str) -> String {
    format!("k{}", key_hex(library_uid))
}

/// The key of the library's title terms: `t` + the same 10 hex characters.
pub fn title_key(library_uid: &str) -> String {
    format!("t{}", key_hex(library_uid))
}

/// What a chunk's keyword index holds: its `scoped` property (the text's
/// keyed terms in order and with repeats, then the item title's under the
/// title key) and `dl`, the text's length in terms (what BM25 normalizes by).
pub struct Indexed {
    pub scoped: String,
    pub dl: i64,
}

/// The index entry of a chunk of `library_uid`: analyzed in the language
/// its text is clearly written in, else in the library's `language`.
pub fn scoped_text(library_uid: &str, language: Language, title: &str, text: &str) -> Indexed {
    let a = analyzer(analysis::detect(text).unwrap_or(language));
    let (key, tkey) = (library_key(library_uid), title_key(library_uid));
    let body = a.tokens(text);
    let mut out = String::with_capacity(text.len() * 2);
    let mut push = |key: &str, t: &str| {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(key);
        out.push('_');
        out.push_str(t);
    };
    for t in &body {
        push(&key, t);
    }
    for t in a.tokens(title) {
        push(&tkey, &t);
    }
    Indexed {
        scoped: out,
        dl: body.len() as i64,
    }
}

/// Counts how often each query word occurs in a chunk's `scoped` text under
/// one library's text key and under its title key. Counted here rather than
/// in Cypher: string splitting per candidate doubled a broad query's cost on
/// the graph server, and a SIMD substring search over the stored text costs
/// well under a microsecond per chunk.
pub struct TermCounter {
    text: Vec<memchr::memmem::Finder<'static>>,
    title: Vec<memchr::memmem::Finder<'static>>,
}

impl TermCounter {
    pub fn new(library_uid: &str, words: &[String]) -> Self {
        let (key, tkey) = (library_key(library_uid), title_key(library_uid));
        let finders = |key: &str| {
            words
                .iter()
                .map(|w| memchr::memmem::Finder::new(format!("{key}_{w}").as_bytes()).into_owned())
                .collect()
        };
        TermCounter {
            text: finders(&key),
            title: finders(&tkey),
        }
    }

    /// (text, title) frequencies of the words, in the order given to `new`.
    pub fn count(&self, scoped: &str) -> (Vec<i64>, Vec<i64>) {
        let bytes = scoped.as_bytes();
        let count = |f: &memchr::memmem::Finder<'_>| -> i64 {
            let n = f.needle().len();
            f.find_iter(bytes)
                .filter(|at| (*at == 0 || bytes[at - 1] == b' ') && (at + n == bytes.len() || bytes[at + n] == b' '))
                .count() as i64
        };
        (
            self.text.iter().map(count).collect(),
            self.title.iter().map(count).collect(),
        )
    }
}

/// The distinct terms of a query for libraries in `language`, in order, at
/// most `MAX_QUERY_WORDS` (stop words left out unless nothing else is left):
/// analyzed in the library's language and, when the query looks like
/// another one, in that language too (chunks are analyzed in their own).
pub fn query_words(language: Language, query: &str) -> Vec<String> {
    query_words_grouped(language, query).0
}

/// A query's terms and, for each, the query word it comes from.
pub type QueryWords = (Vec<String>, Vec<usize>);

/// `query_words`, with the query word each term comes from (the stems of one
/// word in the two languages share a group: see `rank::score_grouped`).
pub fn query_words_grouped(language: Language, query: &str) -> QueryWords {
    match analysis::guess(query).filter(|g| *g != language) {
        Some(other) => analysis::query_terms_grouped(&[analyzer(language), analyzer(other)], query, MAX_QUERY_WORDS),
        None => analysis::query_terms_grouped(&[analyzer(language)], query, MAX_QUERY_WORDS),
    }
}

/// Full-text queries for `libs` × `words` (text and title terms), each under
/// `MAX_CLAUSES` clauses: `+scoped:(k1_a t1_a k1_b t1_b …)`. Returns (libraries
/// of the batch, query).
pub fn scoped_queries<'a>(libs: &'a [String], words: &[String]) -> Vec<(&'a [String], String)> {
    if libs.is_empty() || words.is_empty() {
        return Vec::new();
    }
    let per_batch = (MAX_CLAUSES / (2 * words.len())).max(1);
    libs.chunks(per_batch)
        .map(|batch| {
            let mut terms = Vec::with_capacity(2 * batch.len() * words.len());
            for lib in batch {
                let (key, tkey) = (library_key(lib), title_key(lib));
                for w in words {
                    terms.push(format!("{key}_{w}"));
                    terms.push(format!("{tkey}_{w}"));
                }
            }
            (batch, format!("+scoped:({})", terms.join(" ")))
        })
        .collect()
}

/// Splits a chunk's `scoped` property (its text terms under the library's
/// key, then its title terms under the title key: `scoped_text`)
/// into (text terms, title terms), keys removed.
pub fn split_scoped(scoped: &str, text_key: &str, title_key: &str) -> (String, String) {
    let mut text = String::with_capacity(scoped.len());
    let mut title = String::new();
    for tok in scoped.split(' ') {
        let (out, rest) = match tok.split_once('_') {
            Some((k, rest)) if k == text_key => (&mut text, rest),
            Some((k, rest)) if k == title_key => (&mut title, rest),
            _ => continue,
        };
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(rest);
    }
    (text, title)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_syntax_never_reaches_the_index() {
        let q = |s| query_words(Language::English, s);
        assert_eq!(q("(foo AND \"bar"), ["foo", "bar"]);
        assert_eq!(q("a:b"), ["b"]);
        assert!(q("* ? \\ ()").is_empty());
        assert_eq!(q("Tidal tidal TIDAL"), ["tidal"]);
    }

    #[test]
    fn the_stems_of_one_query_word_share_its_group() {
        // Looks like another language, whose stemmer cuts it: two forms,
        // one word (CI's Python suite drew this word; relevance halved).
        let (terms, groups) = query_words_grouped(Language::English, "quokka77bfb5990bfa");
        assert_eq!(terms, ["quokka77bfb5990bfa", "quokka77bfb5990bf"]);
        assert_eq!(groups, [0, 0]);
        let (terms, groups) = query_words_grouped(Language::English, "tidal kelp");
        assert_eq!(terms, ["tidal", "kelp"]);
        assert_eq!(groups, [0, 1]);
    }

    #[test]
    fn term_counter_counts_text_and_title_occurrences_of_the_library_only() {
        let lib = "lib-A.1";
        let idx = scoped_text(lib, Language::English, "Tidal notes", "tidal kelp tidal reef");
        let words = query_words(Language::English, "tidal kelp notes quasar");
        let (tf, tt) = TermCounter::new(lib, &words).count(&idx.scoped);
        let at = |w: &str| words.iter().position(|x| x == w).unwrap();
        assert_eq!((tf[at("tidal")], tt[at("tidal")]), (2, 1));
        assert_eq!((tf[at("kelp")], tt[at("kelp")]), (1, 0));
        assert_eq!((tf[at("note")], tt[at("note")]), (0, 1));
        assert_eq!((tf[at("quasar")], tt[at("quasar")]), (0, 0));
        let (tf, tt) = TermCounter::new("another", &words).count(&idx.scoped);
        assert!(tf.iter().chain(&tt).all(|n| *n == 0));
    }

    #[test]
    fn scoped_words_are_single_analyzer_tokens() {
        let s = scoped_text(
            "lib-A.1",
            Language::English,
            "Title Müller",
            "Grüße, naïve 中文 foo-bar x_y",
        );
        for tok in s.scoped.split(' ') {
            assert!(
                tok.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{tok}"
            );
            assert!(tok.len() <= 11 + 1 + 120);
        }
        let (key, tkey) = (library_key("lib-A.1"), title_key("lib-A.1"));
        assert!(s.scoped.contains(&format!(
            "{key}_foo {key}_bar {key}_x {key}_y {tkey}_titl {tkey}_muller"
        )));
        assert_eq!(s.dl, 7, "title terms do not count in the text's length");
    }

    #[test]
    fn keys_differ_per_library_and_batches_respect_the_clause_cap() {
        assert_ne!(library_key("a"), library_key("b"));
        let libs: Vec<String> = (0..100).map(|i| format!("lib{i}")).collect();
        let words: Vec<String> = (0..30).map(|i| format!("w{i}")).collect();
        let qs = scoped_queries(&libs, &words);
        assert_eq!(qs.iter().map(|(b, _)| b.len()).sum::<usize>(), 100);
        for (batch, q) in &qs {
            assert!(2 * batch.len() * words.len() <= MAX_CLAUSES);
            assert_eq!(q.matches(' ').count() + 1, 2 * batch.len() * words.len());
        }
    }
}
