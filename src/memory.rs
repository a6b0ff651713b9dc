//! glibc's allocator, set for what this process allocates.

/// glibc's allocator settings; `main` calls it first, and the benchmarks
/// that embed do too (so they measure what `serve` runs: before, they ran
/// with glibc's defaults, which made the embedding model look faster).
///
/// Blocks of 1 MiB and more (argon2's 19 MiB per verification) come straight
/// from mmap and go back to the OS when freed. glibc otherwise raises its
/// mmap threshold after the first such free and keeps later blocks in
/// per-thread arenas: measured +328 MB RSS during a flood of wrong Basic
/// passwords (benches/flood_load.rs).
///
/// What it costs the embedding model, which allocates and frees a few MB per
/// layer of a text (a 300-piece chunk: 1.4 MB for Q, K and V, 1.8 MB for the
/// feed-forward's activations): each such tensor is mapped and unmapped, and
/// setting the threshold also fixes the arenas' trim threshold at 128 KiB, so
/// they give back their free tops at every layer and fault them in again.
/// e5 at batch 16 on 2 cores (benches/embed_throughput.rs, `GLIBC_TUNABLES`,
/// the same minutes): 13.7–14.1 chunks/s with this; 18.6–19.7 with a 4 MiB
/// mmap threshold and arenas keeping 16 MiB at their tops, but the soak then
/// ran at 332–433 MB RSS (161–169 MB with this; 203–230 MB and rising over 3
/// minutes with a 4 MiB trim threshold). Not taken: docs/search.md.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator (it takes glibc's own lock).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}
