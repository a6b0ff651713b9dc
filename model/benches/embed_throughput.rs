//! Embedding throughput of the in-process model alone (no stores): chunks of
//! 1,200 characters (the committed quality corpus, cut and joined) embedded
//! in batches, as the worker does, and single short queries, as `search`
//! does. Goals (issues 21, 33): ≥ 20 chunks/s on this 2-core machine, a query
//! ≤ 15 ms p50 (docs/search.md, "Speed of e5", for both models' figures).
//!
//!   RAYON_NUM_THREADS=1 MNEMOSYNE_EMBED_MODEL=.dev/models/multilingual-e5-small cargo bench -p mnemosyne-model --bench embed_throughput
//!   (or .dev/models/all-minilm-l6-v2)
//!
//! With `MNEMOSYNE_CROSS_MODEL` set (.dev/env sets it) each chunk is embedded
//! by the pair, and a query by both models, as `serve` does; `EMBED_CROSS=0`
//! measures the model alone. Paired, it also re-embeds every chunk as a
//! change of configuration does (`Encoder::embed_keeping`): turning the
//! cross-language model on keeps each vector's half of the model, turning it
//! off keeps that half alone.
//!
//! `RAYON_NUM_THREADS=1` is what `mnemosyne serve` sets (one core per text,
//! texts of a batch side by side); without it candle splits each text too.
//!   (EMBED_CHUNKS=96, EMBED_BATCHES=1,8,16,32, EMBED_QUERIES=50)

use std::time::Instant;

use mnemosyne_model::{Cross, Encoder, Kind};

/// A setting from the environment, or its default.
fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The text a chunk is embedded from, as the server makes it
/// (`mnemosyne::embed::chunk_text`): its item's title, then its text.
fn chunk_text(title: &str, text: &str) -> String {
    if title.trim().is_empty() {
        text.to_owned()
    } else {
        format!("{title}\n{text}")
    }
}

/// glibc's allocator as `serve` tunes it (the server's
/// `memory::tune_allocator`: 1 MiB mmap threshold), so this measures what
/// `serve` runs.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator (it takes glibc's own lock).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// The build before the encoder kept its buffers (`a5af0e9`), run with this
/// benchmark's settings above and `EMBED_CHUNKS=48` beside the new build:
/// chunks/s at batch 1 and 16, and the query p50, per model.
fn baseline(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::E5 => ("9.2 / 17.4 chunks/s at batch 1 / 16", "3.4 ms"),
        Kind::MiniLm => ("11.2–11.8 / 22.1–22.8 chunks/s at batch 1 / 16", "6.5 ms"),
    }
}

fn chunks(n: usize) -> Vec<String> {
    let corpus = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/quality/corpus.jsonl"))
        .expect("benches/quality/corpus.jsonl");
    let docs: Vec<(String, String)> = corpus
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                v["title"].as_str().unwrap_or("").to_string(),
                v["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    let mut i = 0;
    while out.len() < n {
        let (title, _) = &docs[i % docs.len()];
        let mut text = String::new();
        let mut j = i;
        while text.chars().count() < 1200 {
            text.push_str(&docs[j % docs.len()].1);
            text.push(' ');
            j += 1;
        }
        let text: String = text.chars().take(1200).collect();
        out.push(chunk_text(title, &text));
        i += 1;
    }
    out
}

/// CPU seconds this process has used (user + system, from /proc): the rate
/// per CPU-second stays comparable when other work shares the machine.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    // Fields 14 and 15 (utime, stime, in ticks of 1/100 s) are the 12th and
    // 13th after the name's closing parenthesis.
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("embed_throughput: bench");
        return;
    }
    // The allocator as `serve` tunes it (main.rs).
    tune_allocator();
    let Some(dir) =
        std::env::var_os("MNEMOSYNE_EMBED_MODEL").or_else(|| std::env::var_os("MNEMOSYNE_TEST_EMBED_MODEL"))
    else {
        eprintln!("embed_throughput: set MNEMOSYNE_EMBED_MODEL (scripts/dev up writes it into .dev/env)");
        std::process::exit(2);
    };
    let alone = Encoder::load(std::path::Path::new(&dir)).expect("the model loads");
    // MNEMOSYNE_CROSS_MODEL (as .dev/env sets it): the model paired with the
    // cross-language one, as `serve` runs it; EMBED_CROSS=0 leaves it out.
    let cross = std::env::var_os("MNEMOSYNE_CROSS_MODEL")
        .filter(|d| !d.is_empty() && std::env::var("EMBED_CROSS").map_or(true, |v| v != "0"))
        .map(|d| Cross::shared(std::path::Path::new(&d)).expect("the cross-language model loads"));
    let paired = cross.as_ref().map(|c| alone.with_cross(c.clone()));
    let embedder = paired.as_ref().unwrap_or(&alone);
    let n: usize = setting("EMBED_CHUNKS", 96);
    let batches: Vec<usize> = std::env::var("EMBED_BATCHES")
        .unwrap_or_else(|_| "1,8,16,32".into())
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .collect();
    let texts = chunks(n);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    println!(
        "embed_throughput: model {}, {} chunks of 1,200 characters, {} compute threads",
        embedder.id(),
        n,
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all cores".into())
    );
    embedder.embed(&refs[..2]).expect("warm-up");
    let (chunks_before, query_before) = baseline(embedder.kind());
    for &b in &batches {
        let t = Instant::now();
        let c = cpu_seconds();
        for part in refs.chunks(b.max(1)) {
            embedder.embed(part).expect("embeds");
        }
        let s = t.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - c;
        println!(
            "  batch {b:>3}: {:>6.1} chunks/s  ({:.0} ms per chunk; {:.1} chunks per CPU-second)   before (a5af0e9): {chunks_before}",
            n as f64 / s,
            s * 1000.0 / n as f64,
            n as f64 / cpu.max(0.01)
        );
    }
    let q: usize = setting("EMBED_QUERIES", 50);
    let queries = [
        "why are there two high tides a day",
        "seaweed carbon storage",
        "how does a heat pump work in winter",
        "Gezeiten Mond",
    ];
    // (p50, p95) in ms of `embed` over the q queries.
    let timed = |embed: &dyn Fn(&str)| -> (f64, f64) {
        let mut ms: Vec<f64> = (0..q)
            .map(|i| {
                let t = Instant::now();
                embed(queries[i % queries.len()]);
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        (ms[ms.len() / 2], ms[(ms.len() * 95 / 100).min(ms.len() - 1)])
    };
    let (p50, p95) = timed(&|text| {
        embedder.embed_query(text).expect("embeds");
        if let Some(c) = &cross {
            c.embed(text).expect("embeds");
        }
    });
    println!("  query (one short text): p50 {p50:.1} ms, p95 {p95:.1} ms   before (a5af0e9): p50 {query_before}");
    if let Some(c) = &cross {
        let (p50, p95) = timed(&|text| {
            c.embed(text).expect("embeds");
        });
        println!("  of which the cross-language model alone: p50 {p50:.2} ms, p95 {p95:.2} ms");
        // A change of model re-embeds every chunk, keeping the half of its
        // vector the two configurations share (`Encoder::embed_keeping`).
        let b = batches.iter().copied().max().unwrap_or(16).max(1);
        // Seconds to re-embed every chunk.
        let switch = |to: &Encoder, from: &Encoder| -> f64 {
            let stored = from.embed(&refs).expect("embeds");
            let earlier: Vec<Option<(&str, &[f32])>> = stored.iter().map(|v| Some((from.id(), v.as_slice()))).collect();
            let t = Instant::now();
            for (part, early) in refs.chunks(b).zip(earlier.chunks(b)) {
                let (_, kept) = to.embed_keeping(part, early).expect("embeds");
                assert_eq!(kept, part.len(), "every vector keeps a half");
            }
            t.elapsed().as_secs_f64()
        };
        let (on, off) = (switch(embedder, &alone), switch(&alone, embedder));
        println!(
            "  re-embedding at batch {b}, the cross-language model turned on: {:.1} chunks/s (the model's half kept; \
             afresh: the batch line above); turned off: {n} chunks in {:.2} ms (no model runs)",
            n as f64 / on,
            off * 1000.0
        );
    }
}
