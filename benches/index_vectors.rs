//! Semantic candidates from one library's index alone (no stores, no model):
//! `LibraryIndex::nearest` for the best 100 (what `search` asks of every
//! library in scope) over N chunks with pseudo-random unit vectors, written
//! in commits of 5,000 (the build's pages: several segments, as a built
//! library has), then the same after a merge into one segment.
//!
//!   cargo bench --bench index_vectors
//!   (INDEX_CHUNKS=10000, INDEX_QUERIES=200, INDEX_K=100)
//!
//! `INDEX_PAIR=1` stores vectors as the pair stores them (the embedding
//! model's 384 values, then the cross-language model's 512: 896) and runs
//! each query twice: over both halves (hybrid) and over the first half
//! alone (semantic mode, which scans the embedding model's codes only).
//!
//! Prints p50/p90 per query, first search (cold) and warm, beside the
//! baseline measured on main before the decoded-codes cache.

#[path = "common.rs"]
mod common;

use std::time::Instant;

use mnemosyne::search::index::vectors::CodeCache;
use mnemosyne::search::index::{Applied, IndexedChunk, LibraryIndex};

/// `nearest` on main at ac81348 (the int8 codes streamed from tantivy's
/// bytes dictionary and every rescored uid looked up in its sstable, on
/// every search), this machine (two runs, while a build ran), 10,000 chunks,
/// k 100.
const BASELINE: &str = "p50 6.58–7.47 ms as written, 9.07–12.07 ms merged (10,000 chunks, main ac81348)";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A stored vector: the embedding model's unit vector, then (`pair`) a
/// 512-value unit vector as the cross-language model's.
fn vector(seed: u64, pair: bool) -> Vec<f32> {
    let mut v = common::unit_vector(seed);
    if pair {
        let mut u = common::unit_vector(seed ^ 0x5555_0000_0000);
        u.extend_from_slice(&common::unit_vector(seed ^ 0xaaaa_0000_0000)[..128]);
        let n = u.iter().map(|a| a * a).sum::<f32>().sqrt();
        v.extend(u.into_iter().map(|a| a / n));
    }
    v
}

/// Queries the index's vectors (of `dim` values) on their first `len`.
fn run(idx: &LibraryIndex, label: &str, queries: usize, k: usize, (dim, len): (usize, usize)) {
    let pair = dim > mnemosyne::embed::DIM;
    let t = Instant::now();
    let first = idx
        .nearest(&vector(1_000_000, pair)[..len], dim, k, None)
        .expect("nearest");
    let cold = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(first.len(), k.min(idx.num_chunks() as usize));
    let mut ms = Vec::with_capacity(queries);
    for i in 0..queries {
        let q = vector(2_000_000 + i as u64, pair);
        let t = Instant::now();
        let got = idx.nearest(&q[..len], dim, k, None).expect("nearest");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(got);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "{label}: first search {cold:.2} ms; then p50 {:.2} ms, p90 {:.2} ms ({queries} queries, k {k})",
        percentile(&ms, 0.5),
        percentile(&ms, 0.9)
    );
}

fn main() {
    let n = common::setting::<usize>("INDEX_CHUNKS", 10_000);
    let queries = common::setting::<usize>("INDEX_QUERIES", 200);
    let k = common::setting::<usize>("INDEX_K", 100);
    let pair = std::env::var("INDEX_PAIR").is_ok_and(|v| v == "1");
    let dim = vector(0, pair).len();
    // (the vectors' length, the query's): both halves, then the first alone.
    let shapes: Vec<(usize, usize, &str)> = if pair {
        vec![
            (dim, dim, "(both halves)"),
            (dim, mnemosyne::embed::DIM, "(first half)"),
        ]
    } else {
        vec![(dim, dim, "")]
    };
    let path = std::env::temp_dir().join(format!("mnemosyne-bench-index-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let idx = LibraryIndex::open_or_create(&path, CodeCache::unbounded()).expect("index");
    let t = Instant::now();
    for (page, start) in (0..n).step_by(5_000).enumerate() {
        let chunks: Vec<IndexedChunk> = (start..(start + 5_000).min(n))
            .map(|i| IndexedChunk {
                chunk_uid: format!("c{i:07}"),
                item_uid: format!("i{:06}", i / 10),
                collection_uid: "col".into(),
                text_terms: "w".into(),
                dl: 1,
                vector: Some(vector(i as u64, pair)),
                ..Default::default()
            })
            .collect();
        let applied = Applied {
            seq: page as i64 + 1,
            library_uid: "bench".into(),
            model: "bench".into(),
            ..Default::default()
        };
        idx.apply(&[], &chunks, &applied).expect("apply");
    }
    println!(
        "index_vectors: {n} chunks written in {:.1} s ({} MB on disk); baseline {BASELINE}",
        t.elapsed().as_secs_f64(),
        idx.disk_bytes() / 1_000_000
    );
    for &(d, len, what) in &shapes {
        run(&idx, &format!("segments as written {what}"), queries, k, (d, len));
    }
    idx.merge_all().expect("merge");
    for &(d, len, what) in &shapes {
        run(&idx, &format!("merged into one segment {what}"), queries, k, (d, len));
    }
    drop(idx);
    let _ = std::fs::remove_dir_all(&path);
}
