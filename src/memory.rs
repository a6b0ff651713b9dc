//! glibc's allocator, set for what this process allocates: the server
//! crate's only `unsafe` (allocator calls), in one place.

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
/// The embedding model used to pay for it: it allocated and freed a few MB
/// per layer of a text, each mapped and unmapped afresh (e5 at batch 16 on
/// 2 cores: 13.7–14.1 chunks/s with this, 18.6–19.7 with a 4 MiB threshold
/// and arenas keeping 16 MiB, but then the soak ran at 332–433 MB RSS against
/// 161–169). The encoder now keeps its buffers from one text to the next
/// (the runtime crate's `bert::Scratch`, model/): 24 chunks/s with this setting (docs/search.md).
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator (it takes glibc's own lock).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Hands the allocator's free pages back to the OS (glibc: `malloc_trim`;
/// elsewhere nothing). Blocking: it walks every arena, so call it off the
/// async workers.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it has no
    // preconditions and may be called from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
