//! CPU time and memory of a process, from `/proc/<pid>/stat` and `/proc/<pid>/status`, and the
//! whole machine's CPU time, from `/proc/stat`.

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
    /// The part of the resident set that is anonymous memory (heap, stacks), bytes.
    pub rss_anon: u64,
    /// The part that is file pages (the binary's code and read-only data, shared libraries),
    /// bytes.
    pub rss_file: u64,
}

/// Reads `pid`; `None` when it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcSample {
        cpu: cpu_time(&stat)?,
        rss: status_kib(&status, "VmRSS:")? * 1024,
        peak_rss: status_kib(&status, "VmHWM:")? * 1024,
        rss_anon: status_kib(&status, "RssAnon:")? * 1024,
        rss_file: status_kib(&status, "RssFile:")? * 1024,
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

/// The whole machine's CPU time so far, every CPU together (`/proc/stat`'s `cpu` line).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MachineCpu {
    /// Time the CPUs were busy (user, nice, system, irq, softirq, steal).
    pub busy: Duration,
    /// Busy plus idle and I/O wait.
    pub total: Duration,
}

impl MachineCpu {
    /// Reads `/proc/stat`; `None` where it cannot be read.
    pub fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        // user nice system idle iowait irq softirq steal (guest time is counted in user).
        let field = |i: usize| ticks.get(i).copied().unwrap_or(0);
        let busy = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
        let idle = field(3) + field(4);
        let seconds = |t: u64| Duration::from_secs_f64(t as f64 / ticks_per_second());
        Some(Self {
            busy: seconds(busy),
            total: seconds(busy + idle),
        })
    }
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
        assert!(me.rss_anon > 0 && me.rss_file > 0 && me.rss_anon + me.rss_file <= me.rss);
    }

    #[test]
    fn machine_cpu_counts_busy_and_idle_ticks_of_every_cpu() {
        let stat = "cpu  100 10 50 800 40 5 5 0 7 0\ncpu0 50 5 25 400 20 2 3 0 0 0\nintr 1 2\n";
        let ticks = ticks_per_second();
        let cpu = MachineCpu::parse(stat).unwrap();
        assert_eq!(cpu.busy, Duration::from_secs_f64(170.0 / ticks));
        assert_eq!(cpu.total, Duration::from_secs_f64(1010.0 / ticks));
        assert_eq!(MachineCpu::parse("intr 1 2\n"), None);
    }

    #[test]
    fn parses_times_after_a_comm_with_spaces() {
        let stat = "42 (a b) S 1 2 3 4 5 6 7 8 9 10 200 100 0 0";
        let ticks = ticks_per_second();
        assert_eq!(cpu_time(stat), Some(Duration::from_secs_f64(300.0 / ticks)));
    }
}
