//! How glibc's allocator hands memory back in the long-running processes
//! (`kiln server`, `kiln agent`, `kiln up`, `kiln exec`; issue 47).
//!
//! glibc serves an allocation of 128 KiB or more with its own `mmap` and
//! returns it on free, but the first such free raises that threshold to
//! the freed size (up to 32 MiB) for the rest of the process. After one
//! 1 MiB log chunk or artifact part, every later one came from the heap
//! arenas instead, where a freed buffer under a live allocation is kept.
//! `kiln bench memory`, after a 200 MB log and 100 artifacts: the agent's
//! anonymous memory 24.3 MB of which 8 MB were live allocations, 16.7 MB
//! with the threshold fixed; the server's 19.3 MB, 14.5 MB fixed. A fixed
//! threshold keeps large buffers out of the arenas: they go back to the
//! system when freed. The cost is one `mmap`/`munmap` pair and the
//! page faults per large buffer, which the log paths avoid where it counts
//! by reusing their chunk buffers within a job (`kiln-agent`'s `logs.rs`).
#![allow(unsafe_code)]

/// The fixed threshold: glibc's own starting value.
pub(crate) const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Fixes the `mmap` threshold (see the module docs). Call once, first
/// thing, before other threads allocate.
pub(crate) fn return_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; it is called
    // before the runtime starts any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}
