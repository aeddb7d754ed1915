//! Giving the heap memory the controller freed back to the system.
//!
//! glibc's allocator keeps what a program frees inside its heaps (the main one and one per
//! thread that allocated at the same time as another) and returns only what is free at the very
//! top of a heap. After a burst of rollouts the controller's resident memory stays near the
//! burst's high-water mark although the live heap shrank: on an idle fleet of 200 TWDs a quarter
//! of the anonymous memory was such freed memory (BENCHMARKS.md, "Controller memory").
//! `malloc_trim(0)` hands every whole free page of every heap back to the kernel; done every few
//! seconds, the resident memory follows the live heap. It costs one pass over the heaps' free
//! lists (its duration is logged at `trace` level) and, later, page faults for pages used again.
//!
//! Only glibc has the call. Elsewhere (musl) [`trim`] reports `None` and the loop ends at once.

use std::time::{Duration, Instant};

/// Returns the free pages of every heap to the kernel. `Some(released)`: whether anything was
/// returned; `None` where the allocator has no such call.
pub fn trim() -> Option<bool> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes the arenas' own locks; it is safe to call from any thread
        // at any time, and 0 asks it to keep no padding.
        let released = unsafe { libc::malloc_trim(0) };
        Some(released != 0)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Trims the heap every `interval` until `stop` completes. Runs each trim on a blocking thread:
/// it holds each arena's lock while it walks that arena, which a runtime thread must not wait on.
pub async fn trim_every(interval: Duration, stop: impl std::future::Future<Output = ()>) {
    if interval.is_zero() || trim().is_none() {
        return;
    }
    tokio::pin!(stop);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick completes at once; the heap has nothing to give back yet.
    ticks.tick().await;
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => {}
        }
        let started = Instant::now();
        match tokio::task::spawn_blocking(trim).await {
            Ok(Some(released)) => {
                tracing::trace!(
                    released,
                    took_us = started.elapsed().as_micros() as u64,
                    "trimmed the heap"
                );
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("trimming the heap: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory freed in the middle of the heap goes back to the kernel: the process's resident
    /// anonymous memory drops after a trim. A fresh thread allocates, so its arena holds nothing
    /// else; a small block is kept at the top so only a trim (not free's own top-of-heap
    /// release) can return the rest.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_trim_returns_memory_freed_in_the_middle_of_the_heap() {
        fn rss_anon_kib() -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
            status
                .lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .expect("RssAnon in /proc/self/status")
        }
        let (before, after) = std::thread::spawn(|| {
            // 64 MiB in 4 KiB blocks (below the mmap threshold, so they come from the heap),
            // each written so its page is resident.
            let mut blocks: Vec<Vec<u8>> = (0..16 * 1024).map(|_| vec![1u8; 4096]).collect();
            let top = vec![1u8; 4096];
            blocks.clear();
            blocks.shrink_to_fit();
            let before = rss_anon_kib();
            assert_eq!(trim(), Some(true), "the trim returned nothing");
            let after = rss_anon_kib();
            drop(top);
            (before, after)
        })
        .join()
        .expect("allocating thread");
        assert!(
            before.saturating_sub(after) >= 32 * 1024,
            "RssAnon went from {before} kB to {after} kB: under 32 MiB returned of the 64 MiB freed"
        );
    }
}
