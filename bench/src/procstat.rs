//! CPU time and memory of a process, from `/proc/<pid>/stat` and `/proc/<pid>/status`.

use std::time::Duration;

/// Clock ticks per second of `/proc/<pid>/stat` times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// One reading of a process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcSample {
    /// User + system CPU time so far.
    pub cpu: Duration,
    /// Resident set size, bytes.
    pub rss: u64,
    /// Peak resident set size since the process started, bytes.
    pub peak_rss: u64,
}

/// Reads `pid`; `None` when it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcSample {
        cpu: cpu_time(&stat)?,
        rss: status_kib(&status, "VmRSS:")? * 1024,
        peak_rss: status_kib(&status, "VmHWM:")? * 1024,
    })
}

/// utime + stime of a `/proc/<pid>/stat` line (fields 14 and 15, after the `(comm)`).
fn cpu_time(stat: &str) -> Option<Duration> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // after_comm starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / ticks_per_second(),
    ))
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = sample(std::process::id()).unwrap();
        assert!(me.rss > 0 && me.peak_rss >= me.rss);
    }

    #[test]
    fn parses_times_after_a_comm_with_spaces() {
        let stat = "42 (a b) S 1 2 3 4 5 6 7 8 9 10 200 100 0 0";
        let ticks = ticks_per_second();
        assert_eq!(cpu_time(stat), Some(Duration::from_secs_f64(300.0 / ticks)));
    }
}
