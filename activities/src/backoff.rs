//! Delays between tries and between polls, from `backon` and always jittered: many rollouts
//! that started waiting together (a burst, a restarted controller) must not come back
//! together, in phase, against the same server.

use std::time::Duration;

use backon::{BackoffBuilder, ConstantBuilder, ExponentialBuilder};

/// Delays after failed tries: `first`, then twice as long each time up to `max`, each plus a
/// random jitter of up to as much again. Never ends; the caller decides when to stop.
pub fn exponential(first: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send {
    ExponentialBuilder::new()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Delays between polls of outside state: `interval` on average, each between two thirds and
/// four thirds of it. Never ends.
pub fn polls(interval: Duration) -> impl Iterator<Item = Duration> + Send {
    ConstantBuilder::new()
        .with_delay(interval * 2 / 3)
        .with_jitter()
        .without_max_times()
        .build()
}

/// One delay of [`polls`]: `interval` spread by a third either way.
pub fn spread(interval: Duration) -> Duration {
    polls(interval).next().unwrap_or(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 arithmetic in `backon`: bounds hold to the millisecond.
    const SLACK: Duration = Duration::from_millis(1);

    #[test]
    fn exponential_delays_double_up_to_the_cap_with_jitter_on_top() {
        let first = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        let delays: Vec<Duration> = exponential(first, max).take(8).collect();
        for (i, delay) in delays.iter().enumerate() {
            let step = (first * 2u32.pow(i as u32)).min(max);
            assert!(
                *delay + SLACK >= step && *delay <= step * 2 + SLACK,
                "delay {i}: {delay:?} for step {step:?}"
            );
        }
        let distinct: std::collections::BTreeSet<Duration> = delays[4..].iter().copied().collect();
        assert!(distinct.len() > 1, "capped delays are jittered: {delays:?}");
    }

    #[test]
    fn polls_spread_around_their_interval() {
        let interval = Duration::from_secs(3);
        let delays: Vec<Duration> = polls(interval).take(200).collect();
        for delay in &delays {
            assert!(
                *delay + SLACK >= interval * 2 / 3 && *delay <= interval * 4 / 3 + SLACK,
                "{delay:?}"
            );
        }
        let mean = delays.iter().sum::<Duration>() / 200;
        assert!(
            mean > interval * 9 / 10 && mean < interval * 11 / 10,
            "mean {mean:?}"
        );
    }
}
