//! Issue 30's sizing question for the per-library search index alone (no
//! stores, no model): disk and idle memory with 1,000,000 chunks across 100
//! libraries.
//!
//! 1. Builds `SCALE_LIBRARIES` library indexes of `SCALE_CHUNKS` chunks each
//!    in a temporary directory, as the server's build does (`build_now` in
//!    `store/graph/indexing.rs`): pages of 5,000 chunks added, one commit,
//!    the writer closed, the staging directory renamed into place. Chunks
//!    are 1,200 characters cut from the committed quality corpus (starting
//!    document and word vary by library and chunk), 10 per item, one
//!    collection per library, analyzed with the server's own analysis
//!    (`scoped::scoped_text`, then `scoped::split_scoped`), each with a
//!    pseudo-random unit vector (int8 codes and f32 in the index, as in
//!    production).
//! 2. Drops everything, then serves them as a replica would: one shared
//!    `CodeCache` with the server's default budget
//!    (`MNEMOSYNE_VECTOR_CACHE_CHUNKS`), at most
//!    `MNEMOSYNE_INDEX_OPEN_LIBRARIES` open (the least recently used closed
//!    beyond it), and in each library one broad two-word keyword search
//!    (`score_grouped`, as hybrid search calls it: best 100, no floor) and
//!    one `nearest` (k 100).
//! 3. Runs the same serving pass again in a fresh process (this program,
//!    `SCALE_SERVE_ONLY` set): a replica started on indexes already on
//!    disk, whose memory holds nothing left from building.
//! 4. Reports disk (by file kind too) and the memory of /proc/self/status
//!    at each stage; the directory is removed at the end.
//!
//! With `SCALE_CURVE` set, it does only issue 52's curve instead: one
//! library grown to 10,000, 100,000 and 1,000,000 chunks, broad, mixed and
//! selective keyword queries timed pruned beside the exhaustive oracle at
//! each size (see `curve`).
//!
//!   cargo bench --bench index_scale
//!   SCALE_CURVE=1 cargo bench --bench index_scale   (CURVE_POOL, CURVE_RUNS, CURVE_ORACLE_RUNS)
//!   (SCALE_LIBRARIES=100, SCALE_CHUNKS=10000; quick: SCALE_LIBRARIES=3 SCALE_CHUNKS=2000;
//!    MNEMOSYNE_VECTOR_CACHE_CHUNKS and MNEMOSYNE_INDEX_OPEN_LIBRARIES as the server reads them)

#[path = "common.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use mnemosyne::analysis::scoped;
use mnemosyne::analysis::scoped::split_scoped;
use mnemosyne::analysis::{analyzer, Language};
use mnemosyne::embed::DIM;
use mnemosyne::search::index::vectors::{quantized_len, CodeCache};
use mnemosyne::search::index::{Applied, IndexedChunk, LibraryIndex};
use mnemosyne::store::graph::ingest::derived_uid;

/// The server's defaults (src/config.rs): decoded vector codes kept, in
/// chunks, and library indexes open at once.
const VECTOR_CACHE_CHUNKS: usize = 2_000_000;
const OPEN_LIBRARIES: usize = 64;
/// Chunks per page of a build (`PAGE` in store/graph/indexing.rs).
const PAGE: usize = 5_000;
/// Characters per chunk, chunks per item.
const CHUNK_CHARS: usize = 1_200;
const ITEM_CHUNKS: usize = 10;
/// Best candidates asked of every library in scope (`fusion::CANDIDATES`).
const K: usize = 100;

/// splitmix64: the corpus position of each chunk.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// 1,200 characters of the corpus from document `start`, after `skip` of
/// its words, the next documents joined on (as `embed_throughput` cuts it).
fn cut(docs: &[(String, String)], start: usize, skip: usize) -> String {
    let first = &docs[start % docs.len()].1;
    let from = first.match_indices(' ').nth(skip).map_or(0, |(i, _)| i + 1);
    let mut text = first[from..].to_string();
    text.push(' ');
    let mut j = start + 1;
    while text.chars().count() < CHUNK_CHARS {
        text.push_str(&docs[j % docs.len()].1);
        text.push(' ');
        j += 1;
    }
    text.chars().take(CHUNK_CHARS).collect()
}

/// The corpus's content words (a word is one when "the <word>" drops "the"
/// and keeps it), most documents first: (documents holding it, its stem, the
/// form written most often).
fn content_words(docs: &[(String, String)]) -> Vec<(usize, String, String)> {
    let en = analyzer(Language::English);
    let mut content: HashMap<String, Option<String>> = HashMap::new();
    let mut df: HashMap<String, usize> = HashMap::new();
    let mut forms: HashMap<String, HashMap<String, usize>> = HashMap::new();
    for (_, text) in docs {
        let mut seen = HashSet::new();
        for w in text
            .to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| w.len() > 1)
        {
            let stem = content
                .entry(w.to_string())
                .or_insert_with(|| {
                    let q = en.query_terms(&format!("the {w}"), 4);
                    (q.len() == 1 && q[0] != "the").then(|| q[0].clone())
                })
                .clone();
            let Some(stem) = stem else { continue };
            *forms.entry(stem.clone()).or_default().entry(w.to_string()).or_default() += 1;
            if seen.insert(stem.clone()) {
                *df.entry(stem).or_default() += 1;
            }
        }
    }
    let form = |stem: &str| {
        let mut f: Vec<(&String, &usize)> = forms[stem].iter().collect();
        f.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        f[0].0.clone()
    };
    let mut top: Vec<(usize, String, String)> = df
        .into_iter()
        .map(|(stem, n)| {
            let f = form(&stem);
            (n, stem, f)
        })
        .collect();
    top.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    top
}

/// The query: the corpus's two content words found in the most documents
/// (a broad query, as `search_load`'s `quasar tidal` is).
fn broad_query(docs: &[(String, String)]) -> (String, String) {
    let top = content_words(docs);
    // Each as the word written most often; the first pair the server's
    // query analysis keeps as two terms (a pair it guesses is in another
    // language gets that language's stems too).
    let pct = |n: usize| 100.0 * n as f64 / docs.len() as f64;
    for j in 1..top.len().min(20) {
        for i in 0..j {
            let q = format!("{} {}", top[i].2, top[j].2);
            if scoped::query_words_grouped(Language::English, &q).0.len() == 2 {
                let note = format!(
                    "in {:.0} % and {:.0} % of the corpus's documents",
                    pct(top[i].0),
                    pct(top[j].0)
                );
                return (q, note);
            }
        }
    }
    (
        top[0].2.clone(),
        format!("in {:.0} % of the corpus's documents", pct(top[0].0)),
    )
}

/// The chunks of one page of library `lib` (chunks `from..to`), as the build
/// reads them from the graph (`chunk_of`, `Source::fill`); the time spent
/// in the analysis is added to `analyzing`.
fn page(
    docs: &[(String, String)],
    lib: usize,
    uid: &str,
    collection: &str,
    (from, to): (usize, usize),
    analyzing: &mut f64,
) -> Vec<IndexedChunk> {
    let (key, tkey) = (scoped::library_key(uid), scoped::title_key(uid));
    (from..to)
        .map(|i| {
            let (item_no, ordinal) = (i / ITEM_CHUNKS, i % ITEM_CHUNKS);
            let r = mix(((lib as u64) << 32) | i as u64);
            let text = cut(docs, (r % docs.len() as u64) as usize, ((r >> 32) % 12) as usize);
            // The item's title: that of the document its first chunk starts in.
            let first = mix(((lib as u64) << 32) | (item_no * ITEM_CHUNKS) as u64);
            let title = &docs[(first % docs.len() as u64) as usize].0;
            let item_uid = derived_uid("item", &[uid, collection, &format!("docs/{item_no:06}.md")]);
            let chunk_uid = derived_uid("chk", &[&item_uid, &format!("{first:016x}"), &ordinal.to_string()]);
            let t = Instant::now();
            let indexed = scoped::scoped_text(uid, Language::English, title, &text);
            let (text_terms, title_terms) = split_scoped(&indexed.scoped, &key, &tkey);
            *analyzing += t.elapsed().as_secs_f64();
            IndexedChunk {
                chunk_uid,
                item_uid,
                item_title: title.clone(),
                collection_uid: collection.to_owned(),
                ordinal: ordinal as i64,
                text,
                text_terms,
                title_terms,
                dl: indexed.dl,
                source_uri: Some(format!(
                    "https://docs.example.org/library-{lib:03}/docs/{item_no:06}.md"
                )),
                mime_type: Some("text/markdown".into()),
                updated_at: Some(format!(
                    "2025-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                    1 + item_no % 12,
                    1 + item_no % 28,
                    item_no % 24,
                    item_no % 60,
                    (item_no / 60) % 60,
                    item_no % 1000
                )),
                vector: Some(common::unit_vector(((lib as u64) << 32) | i as u64)),
            }
        })
        .collect()
}

/// (VmRSS, RssAnon, RssFile, VmHWM) in kB.
fn memory() -> [u64; 4] {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    [field("VmRSS:"), field("RssAnon:"), field("RssFile:"), field("VmHWM:")]
}

fn print_memory(stage: &str, m: [u64; 4]) {
    let mb = |kb: u64| kb as f64 / 1024.0;
    println!(
        "  {stage:<44} VmRSS {:>8.1} MB  RssAnon {:>8.1} MB  RssFile {:>8.1} MB  VmHWM {:>8.1} MB",
        mb(m[0]),
        mb(m[1]),
        mb(m[2]),
        mb(m[3])
    );
}

/// Resident bytes of the mapped index files under `root`, by file kind
/// (/proc/self/smaps).
fn mapped_by_kind(root: &Path) -> Vec<(String, u64)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let root = root.to_string_lossy();
    let mut out: HashMap<String, u64> = HashMap::new();
    let mut kind: Option<String> = None;
    for l in smaps.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            kind = l
                .split_whitespace()
                .nth(5)
                .filter(|path| path.starts_with(root.as_ref()))
                .map(|path| {
                    Path::new(path)
                        .extension()
                        .map_or("other".into(), |x| x.to_string_lossy().into_owned())
                });
        } else if let (Some(k), Some(kb)) = (&kind, l.strip_prefix("Rss:")) {
            let kb: u64 = kb.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *out.entry(k.clone()).or_default() += kb * 1024;
        }
    }
    let mut out: Vec<(String, u64)> = out.into_iter().collect();
    out.sort_by_key(|k| std::cmp::Reverse(k.1));
    out
}

/// Apparent and allocated bytes of the files under `dir` (`du -b`, `du`).
fn du(dir: &Path) -> (u64, u64) {
    let mut out = (0, 0);
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                let (a, b) = du(&e.path());
                out = (out.0 + a, out.1 + b);
            } else {
                out = (out.0 + m.len(), out.1 + m.blocks() * 512);
            }
        }
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Bytes on disk by file kind (tantivy's extensions: `store` the stored
/// fields, `fast` the fast fields with the vectors, `idx`/`term` the
/// postings and term dictionaries), over every library.
fn by_kind(root: &Path) -> Vec<(String, u64)> {
    let mut out: HashMap<String, u64> = HashMap::new();
    for lib in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(lib.path()).into_iter().flatten().flatten() {
            let path = f.path();
            let kind = path
                .extension()
                .map_or("other".to_string(), |x| x.to_string_lossy().into_owned());
            *out.entry(kind).or_default() += f.metadata().map(|m| m.len()).unwrap_or(0);
        }
    }
    let mut out: Vec<(String, u64)> = out.into_iter().collect();
    out.sort_by_key(|k| std::cmp::Reverse(k.1));
    out
}

fn library_uid(l: usize) -> String {
    derived_uid("lib", &["bench-scale", &l.to_string()])
}

fn library_dir(root: &Path, l: usize) -> PathBuf {
    root.join(format!("lib-{l:03}"))
}

struct Served {
    memory: [u64; 4],
    open: usize,
    open_chunks: u64,
    codes_held: usize,
}

/// The replica's pass: every library opened in turn under one code cache,
/// at most `max_open` open (the least recently used closed, as
/// `SearchIndex::install` does), a broad keyword search and a `nearest`
/// in each; the memory read with the last ones still open, then every
/// index dropped.
fn serve(root: &Path, libraries: usize, per_library: usize, query: (&str, &str), label: &str) -> Served {
    let (query, query_note) = query;
    let vector_chunks = common::setting::<usize>("MNEMOSYNE_VECTOR_CACHE_CHUNKS", VECTOR_CACHE_CHUNKS);
    let max_open = common::setting::<usize>("MNEMOSYNE_INDEX_OPEN_LIBRARIES", OPEN_LIBRARIES).max(1);
    let (words, groups) = scoped::query_words_grouped(Language::English, query);
    let codes = CodeCache::new(vector_chunks.saturating_mul(quantized_len(mnemosyne::embed::DIM)));
    let mut open: Vec<(usize, LibraryIndex, u64)> = Vec::new();
    let (mut opening, mut keyword, mut vector) = (Vec::new(), Vec::new(), Vec::new());
    let mut hits = 0usize;
    for l in 0..libraries {
        let t = Instant::now();
        let index = LibraryIndex::open_or_create(&library_dir(root, l), codes.clone()).expect("open");
        let applied = index.applied().expect("applied");
        assert_eq!(
            (applied.library_uid, applied.analysis),
            (library_uid(l), scoped::ANALYSIS_VERSION)
        );
        opening.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let found = index
            .score_grouped(&words, &groups, None, 0.0, K)
            .expect("keyword search");
        keyword.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(!found.is_empty(), "the broad query finds chunks");
        hits += found.len();
        let t = Instant::now();
        let near = index
            .nearest(
                &common::unit_vector(u64::MAX - l as u64),
                mnemosyne::embed::DIM,
                K,
                None,
            )
            .expect("nearest");
        vector.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(near.len(), K.min(per_library));
        open.push((l, index, l as u64));
        while open.len() > max_open {
            let oldest = (0..open.len())
                .filter(|i| open[*i].0 != l)
                .min_by_key(|i| open[*i].2)
                .expect("another library");
            open.swap_remove(oldest);
        }
    }
    let mapped: Vec<String> = mapped_by_kind(root)
        .into_iter()
        .map(|(k, b)| format!("{k} {:.1}", b as f64 / 1e6))
        .collect();
    let served = Served {
        memory: memory(),
        open: open.len(),
        open_chunks: open.iter().map(|(_, ix, _)| ix.num_chunks()).sum(),
        codes_held: codes.bytes(),
    };
    for v in [&mut opening, &mut keyword, &mut vector] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "{label}: query {query:?} (terms {words:?}, {query_note}), {hits} keyword hits in all; first search of each library: \
         open p50 {:.2} ms, keyword p50 {:.2} / p90 {:.2} ms, nearest (k {K}) p50 {:.2} / p90 {:.2} ms",
        percentile(&opening, 0.5),
        percentile(&keyword, 0.5),
        percentile(&keyword, 0.9),
        percentile(&vector, 0.5),
        percentile(&vector, 0.9)
    );
    println!(
        "{label}: {} of {libraries} libraries open ({} chunks; MNEMOSYNE_INDEX_OPEN_LIBRARIES {max_open}); \
         decoded vector codes held {:.1} MB of a {:.1} MB budget (MNEMOSYNE_VECTOR_CACHE_CHUNKS {vector_chunks})",
        served.open,
        served.open_chunks,
        served.codes_held as f64 / 1e6,
        codes.budget() as f64 / 1e6
    );
    println!(
        "{label}: mapped index pages resident (RssFile), MB by file kind: {}",
        mapped.join(", ")
    );
    drop(open);
    assert_eq!(codes.bytes(), 0, "closing an index drops its codes");
    served
}

/// Issue 52's curve (`SCALE_CURVE`): one library grown to each size of
/// `SCALE_CURVE` ("1": 10,000, 100,000 and 1,000,000 chunks; or a list such
/// as "10000,100000"), and at each size broad, mixed and selective keyword
/// queries timed through `score_grouped` (pruned, as the server runs) beside
/// `score_grouped_exhaustive` (every posting scored: the oracle, today's
/// path), their answers compared to the bit. The chunks are recombined from
/// `CURVE_POOL` analyzed ones (the first half of one's terms, the second half
/// of another's, the title of the item's first), so that a million of them
/// take a minute to make; they store no text and no vector (the keyword path
/// reads neither). The library is built once, grown in place (pages of
/// 5,000 added, one commit and the writer closed per size, as a build does).
fn curve(docs: &[(String, String)], sizes: &str) {
    // This thread's CPU time, in ms: on a shared machine the wall clock
    // also counts the time others held the cores.
    fn cpu_ms() -> f64 {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
    }
    let sizes: Vec<usize> = if sizes == "1" {
        vec![10_000, 100_000, 1_000_000]
    } else {
        sizes.split(',').filter_map(|v| v.trim().parse().ok()).collect()
    };
    let pool_size = common::setting::<usize>("CURVE_POOL", 20_000);
    let runs = common::setting::<usize>("CURVE_RUNS", 25);
    let oracle_runs = common::setting::<usize>("CURVE_ORACLE_RUNS", 5);
    let started = Instant::now();
    let uid = library_uid(0);
    let collection = derived_uid("col", &[&uid, "docs"]);
    let mut analyzing = 0.0;
    let pool: Vec<(Vec<String>, String)> = page(docs, 0, &uid, &collection, (0, pool_size), &mut analyzing)
        .into_iter()
        .map(|c| (c.text_terms.split(' ').map(str::to_owned).collect(), c.title_terms))
        .collect();
    println!(
        "curve: a pool of {pool_size} analyzed chunks in {:.1} s; sizes {sizes:?}; {runs} pruned and {oracle_runs} \
         exhaustive runs of each query",
        started.elapsed().as_secs_f64()
    );
    // The queries, from the content words' share of the pool's chunks.
    let mut pool_df: HashMap<&str, usize> = HashMap::new();
    for (terms, _) in &pool {
        let mut seen = HashSet::new();
        for t in terms {
            if seen.insert(t.as_str()) {
                *pool_df.entry(t.as_str()).or_default() += 1;
            }
        }
    }
    let mut words: Vec<(f64, String)> = content_words(docs)
        .into_iter()
        .filter_map(|(_, stem, form)| Some((*pool_df.get(stem.as_str())? as f64 / pool_size as f64, form)))
        .collect();
    words.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let two = |q: &str| scoped::query_words_grouped(Language::English, q).0.len() == 2;
    let mut broad = Vec::new();
    'broad: for j in 1..words.len().min(12) {
        for i in 0..j {
            let q = format!("{} {}", words[i].1, words[j].1);
            if two(&q) {
                broad.push((q, format!("{:.0} % + {:.0} %", 100.0 * words[i].0, 100.0 * words[j].0)));
                if broad.len() == 4 {
                    break 'broad;
                }
            }
        }
    }
    let rare: Vec<&(f64, String)> = words.iter().filter(|w| (0.002..=0.01).contains(&w.0)).collect();
    let step = (rare.len() / 16).max(1);
    let rare: Vec<&(f64, String)> = rare.into_iter().step_by(step).collect();
    let mut selective = Vec::new();
    let mut mixed = Vec::new();
    for pair in rare.chunks(2) {
        if let [a, b] = pair {
            let q = format!("{} {}", a.1, b.1);
            if two(&q) && selective.len() < 4 {
                selective.push((q, format!("{:.1} % + {:.1} %", 100.0 * a.0, 100.0 * b.0)));
            }
            let q = format!("{} {}", a.1, words[0].1);
            if two(&q) && mixed.len() < 4 {
                mixed.push((q, format!("{:.1} % + {:.0} %", 100.0 * a.0, 100.0 * words[0].0)));
            }
        }
    }
    for (class, qs) in [("broad", &broad), ("mixed", &mixed), ("selective", &selective)] {
        let shown: Vec<String> = qs.iter().map(|(q, share)| format!("{q:?} ({share})")).collect();
        println!(
            "curve: {class} queries (share of chunks holding each word): {}",
            shown.join(", ")
        );
    }
    let root = std::env::temp_dir().join(format!("mnemosyne-bench-curve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let index = LibraryIndex::open_or_create(&root, CodeCache::new(0)).expect("index");
    let mut built = 0usize;
    println!(
        "| chunks | segments | query | pruned p50 / p99 ms (CPU p50) | exhaustive (today) p50 / p99 ms (CPU p50) | p50 speed-up (CPU) | hits |"
    );
    println!("|--:|--:|---|--:|--:|--:|--:|");
    for &size in &sizes {
        let t = Instant::now();
        while built < size {
            let to = (built + PAGE).min(size);
            let chunks: Vec<IndexedChunk> = (built..to)
                .map(|j| {
                    let item = j / ITEM_CHUNKS;
                    let (a, _) = &pool[(mix(j as u64) % pool_size as u64) as usize];
                    let (b, _) = &pool[(mix(!(j as u64)) % pool_size as u64) as usize];
                    let (_, title) = &pool[(mix((item * ITEM_CHUNKS) as u64) % pool_size as u64) as usize];
                    let terms: Vec<&str> = a[..a.len() / 2]
                        .iter()
                        .chain(&b[b.len() / 2..])
                        .map(String::as_str)
                        .collect();
                    IndexedChunk {
                        chunk_uid: format!("chk_{:016x}", mix(j as u64 ^ 0xc4c4)),
                        item_uid: format!("item_{item:07}"),
                        item_title: String::new(),
                        collection_uid: collection.clone(),
                        ordinal: (j % ITEM_CHUNKS) as i64,
                        text: String::new(),
                        text_terms: terms.join(" "),
                        title_terms: title.clone(),
                        dl: terms.len() as i64,
                        source_uri: None,
                        mime_type: None,
                        updated_at: None,
                        vector: None,
                    }
                })
                .collect();
            index.add(&chunks).expect("add");
            built = to;
        }
        let applied = Applied {
            seq: (size / ITEM_CHUNKS) as i64,
            library_uid: uid.clone(),
            analysis: scoped::ANALYSIS_VERSION,
            epoch: "bench-curve".into(),
            model: String::new(),
        };
        index.commit(&applied).expect("commit");
        index.close_writer().expect("close writer");
        assert_eq!(index.num_chunks(), size as u64);
        let segments = std::fs::read_dir(&root)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "idx"))
                    .count()
            })
            .unwrap_or(0);
        eprintln!("curve: grown to {size} chunks in {:.1} s", t.elapsed().as_secs_f64());
        for (class, qs) in [("broad", &broad), ("mixed", &mixed), ("selective", &selective)] {
            let analyzed: Vec<(Vec<String>, Vec<usize>)> = qs
                .iter()
                .map(|(q, _)| scoped::query_words_grouped(Language::English, q))
                .collect();
            let (mut pruned, mut oracle) = (Vec::new(), Vec::new());
            let (mut pruned_cpu, mut oracle_cpu) = (Vec::new(), Vec::new());
            let mut hits = 0;
            for (words, groups) in &analyzed {
                // Untimed first: the generation's statistics are read once.
                let want = index
                    .score_grouped_exhaustive(words, groups, None, 0.0, K)
                    .expect("exhaustive");
                let got = index.score_grouped(words, groups, None, 0.0, K).expect("pruned");
                let bits = |h: &[mnemosyne::search::index::Hit]| {
                    h.iter()
                        .map(|h| (h.chunk_uid.clone(), h.score.to_bits(), h.relevance.to_bits()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{words:?}: the pruned answer is the exhaustive one"
                );
                hits += got.len();
            }
            for _ in 0..runs {
                for (words, groups) in &analyzed {
                    let (t, c) = (Instant::now(), cpu_ms());
                    std::hint::black_box(index.score_grouped(words, groups, None, 0.0, K).expect("pruned"));
                    pruned.push(t.elapsed().as_secs_f64() * 1e3);
                    pruned_cpu.push(cpu_ms() - c);
                }
            }
            for _ in 0..oracle_runs {
                for (words, groups) in &analyzed {
                    let (t, c) = (Instant::now(), cpu_ms());
                    std::hint::black_box(
                        index
                            .score_grouped_exhaustive(words, groups, None, 0.0, K)
                            .expect("exhaustive"),
                    );
                    oracle.push(t.elapsed().as_secs_f64() * 1e3);
                    oracle_cpu.push(cpu_ms() - c);
                }
            }
            for v in [&mut pruned, &mut oracle, &mut pruned_cpu, &mut oracle_cpu] {
                v.sort_by(f64::total_cmp);
            }
            let (p50, o50) = (percentile(&pruned, 0.5), percentile(&oracle, 0.5));
            let (c50, oc50) = (percentile(&pruned_cpu, 0.5), percentile(&oracle_cpu, 0.5));
            println!(
                "| {size} | {segments} | {class} | {p50:.2} / {:.2} ({c50:.2}) | {o50:.2} / {:.2} ({oc50:.2}) | {:.1}× ({:.1}×) | {} |",
                percentile(&pruned, 0.99),
                percentile(&oracle, 0.99),
                o50 / p50,
                oc50 / c50,
                hits / analyzed.len().max(1)
            );
        }
    }
    drop(index);
    let _ = std::fs::remove_dir_all(&root);
    println!("curve: run {:.0} s", started.elapsed().as_secs_f64());
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("index_scale: bench");
        return;
    }
    let libraries = common::setting::<usize>("SCALE_LIBRARIES", 100);
    let per_library = common::setting::<usize>("SCALE_CHUNKS", 10_000);
    let total = libraries * per_library;
    let docs = common::corpus();
    if let Ok(sizes) = std::env::var("SCALE_CURVE") {
        curve(&docs, &sizes);
        return;
    }
    let (query, query_note) = broad_query(&docs);
    // The second serving pass: this program again, in a fresh process (a
    // replica started on indexes already on disk), prints its memory lines.
    if let Some(root) = std::env::var_os("SCALE_SERVE_ONLY") {
        let start = memory();
        let served = serve(
            Path::new(&root),
            libraries,
            per_library,
            (&query, &query_note),
            "serving, fresh process",
        );
        print_memory("fresh process: start", start);
        print_memory("fresh process: idle, serving", served.memory);
        print_memory("fresh process: after dropping every index", memory());
        return;
    }
    let root = std::env::temp_dir().join(format!("mnemosyne-bench-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp dir");
    let started = Instant::now();
    println!(
        "index_scale: {libraries} libraries × {per_library} chunks of {CHUNK_CHARS} characters ({total} chunks), \
         {ITEM_CHUNKS} per item, one collection per library, vectors of {DIM} dims; in {}",
        root.display()
    );
    println!("# RssAnon is the process's own memory; RssFile is mapped index pages (page cache, reclaimable).");
    let mut mem = vec![("start (before building)", memory())];

    // 1. Build, as `build_now` does: pages added, one commit, the writer
    //    closed, the staging directory renamed into place.
    let build_cache = CodeCache::new(
        common::setting::<usize>("MNEMOSYNE_VECTOR_CACHE_CHUNKS", VECTOR_CACHE_CHUNKS)
            .saturating_mul(quantized_len(mnemosyne::embed::DIM)),
    );
    let (mut making, mut writing) = (Vec::new(), Vec::new());
    let mut analyzing = 0.0;
    let mut disk = 0u64;
    let mut segments = 0usize;
    for l in 0..libraries {
        let uid = library_uid(l);
        let collection = derived_uid("col", &[&uid, "docs"]);
        let staging = root.join(format!("lib-{l:03}.building"));
        let index = LibraryIndex::open_or_create(&staging, build_cache.clone()).expect("index");
        let (mut made, mut written) = (0.0, 0.0);
        for from in (0..per_library).step_by(PAGE) {
            let t = Instant::now();
            let range = (from, (from + PAGE).min(per_library));
            let chunks = page(&docs, l, &uid, &collection, range, &mut analyzing);
            made += t.elapsed().as_secs_f64();
            let t = Instant::now();
            index.add(&chunks).expect("add");
            written += t.elapsed().as_secs_f64();
        }
        let t = Instant::now();
        let applied = Applied {
            seq: (per_library / ITEM_CHUNKS) as i64,
            library_uid: uid.clone(),
            analysis: scoped::ANALYSIS_VERSION,
            epoch: "bench-scale".into(),
            model: "bench".into(),
        };
        index.commit(&applied).expect("commit");
        index.close_writer().expect("close writer");
        written += t.elapsed().as_secs_f64();
        assert_eq!(index.num_chunks(), per_library as u64);
        disk += index.disk_bytes();
        drop(index);
        std::fs::rename(&staging, library_dir(&root, l)).expect("rename");
        segments += std::fs::read_dir(library_dir(&root, l))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "idx"))
                    .count()
            })
            .unwrap_or(0);
        making.push(made);
        writing.push(written);
    }
    drop(build_cache);
    let (made_s, written_s) = (making.iter().sum::<f64>(), writing.iter().sum::<f64>());
    let (apparent, allocated) = du(&root);
    // MB per million chunks (= bytes a chunk).
    let per_million = |bytes: u64| bytes as f64 / total as f64;
    println!(
        "build: {:.1} s in all, {:.2} s per library: making the chunks {:.1} s ({:.2} s per library, of which the \
         analysis {:.1} s: {:.0} µs a chunk; the server reads them analyzed from the graph), adding, committing \
         and closing the writer {:.1} s ({:.2} s per library); {:.1} segments per library",
        made_s + written_s,
        (made_s + written_s) / libraries as f64,
        made_s,
        made_s / libraries as f64,
        analyzing,
        analyzing / total as f64 * 1e6,
        written_s,
        written_s / libraries as f64,
        segments as f64 / libraries as f64
    );
    println!(
        "disk: {:.1} MB (disk_bytes summed), {:.1} MB apparent / {:.1} MB allocated (du of the directory); \
         per million chunks {:.1} MB (disk_bytes) / {:.1} MB (allocated)",
        disk as f64 / 1e6,
        apparent as f64 / 1e6,
        allocated as f64 / 1e6,
        per_million(disk),
        per_million(allocated)
    );
    let kinds: Vec<String> = by_kind(&root)
        .into_iter()
        .map(|(k, b)| format!("{k} {:.0}", per_million(b)))
        .collect();
    println!("disk by file kind, MB per million chunks: {}", kinds.join(", "));
    mem.push(("after building (everything dropped)", memory()));

    // 2. Serve, in this process, then in a fresh one.
    let served = serve(&root, libraries, per_library, (&query, &query_note), "serving");
    mem.push(("idle, serving (after the search pass)", served.memory));
    mem.push(("after dropping every index", memory()));
    println!("memory (/proc/self/status):");
    for (stage, m) in &mem {
        print_memory(stage, *m);
    }
    let fresh = std::process::Command::new(std::env::current_exe().expect("this bench"))
        .env("SCALE_SERVE_ONLY", &root)
        .env("SCALE_LIBRARIES", libraries.to_string())
        .env("SCALE_CHUNKS", per_library.to_string())
        .output()
        .expect("a fresh process");
    print!("{}", String::from_utf8_lossy(&fresh.stdout));
    eprint!("{}", String::from_utf8_lossy(&fresh.stderr));
    assert!(fresh.status.success(), "the fresh serving process");
    // The fresh process's lines: "… VmRSS <mb> MB  RssAnon <mb> MB  RssFile <mb> MB …".
    let fresh_out = String::from_utf8_lossy(&fresh.stdout).into_owned();
    let fresh_mb = |stage: &str| -> Vec<f64> {
        let Some(l) = fresh_out.lines().find(|l| l.contains(stage)) else {
            return vec![f64::NAN; 3];
        };
        let t: Vec<&str> = l.split_whitespace().collect();
        ["VmRSS", "RssAnon", "RssFile"]
            .iter()
            .map(|name| {
                t.iter()
                    .position(|x| x == name)
                    .and_then(|i| t.get(i + 1)?.parse().ok())
                    .unwrap_or(f64::NAN)
            })
            .collect()
    };
    let (fresh_start, fresh_idle) = (
        fresh_mb("fresh process: start"),
        fresh_mb("fresh process: idle, serving"),
    );
    let _ = std::fs::remove_dir_all(&root);

    let (start, serving) = (mem[0].1, served.memory);
    let mb = |kb: u64| kb as f64 / 1024.0;
    // MB per million chunks open (= bytes a chunk open).
    let open_chunks = served.open_chunks.max(1) as f64;
    let anon_per_chunk = serving[1].saturating_sub(start[1]) as f64 * 1024.0 / open_chunks;
    let fresh_anon_per_chunk = (fresh_idle[1] - fresh_start[1]) * 1024.0 * 1024.0 / open_chunks;
    println!(
        "per million chunks: disk {:.1} MB; idle serving RssAnon above start, per million chunks open: {:.1} MB in \
         a fresh process, {:.1} MB in the building one (decoded vector codes {:.1} MB of it)",
        per_million(disk),
        fresh_anon_per_chunk,
        anon_per_chunk,
        served.codes_held as f64 / open_chunks
    );
    println!(
        "index_scale: {total} chunks in {libraries} libraries: disk {:.0} MB ({:.0} MB per million), index writes \
         {:.2} s per library; idle serving, {} open: RSS {:.0} MB (anon {:.0} MB, file {:.0} MB), peak {:.0} MB; \
         a fresh process serving: RSS {:.0} MB (anon {:.0} MB, file {:.0} MB); run {:.0} s",
        disk as f64 / 1e6,
        per_million(disk),
        written_s / libraries as f64,
        served.open,
        mb(serving[0]),
        mb(serving[1]),
        mb(serving[2]),
        mb(serving[3]),
        fresh_idle[0],
        fresh_idle[1],
        fresh_idle[2],
        started.elapsed().as_secs_f64()
    );
}
