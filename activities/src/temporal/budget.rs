//! Token bucket that limits worker-deployment reads per Temporal namespace.
//!
//! The server limits worker-deployment reads (`DescribeWorkerDeployment`,
//! `DescribeWorkerDeploymentVersion`, `DescribeTaskQueue`, ...) per namespace
//! (`frontend.globalNamespaceWorkerDeploymentReadRPS`, default 50/s). Every read of this module
//! first takes a token from the bucket of its (server, namespace), so many rollouts at once queue
//! here instead of tripping the server's limit.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

/// Default reads per second per Temporal namespace (the server's default limit is 50/s).
pub const DEFAULT_READ_RATE: f64 = 40.0;
/// Default burst: reads allowed at once after an idle period.
pub const DEFAULT_READ_BURST: u32 = 10;

/// How many replicas of the controller share Temporal's limits right now (at least 1): each
/// takes this share of a namespace's read rate. Kept current by the controller's replica
/// Leases (`src/replicas.rs`).
#[derive(Debug, Clone)]
pub struct Replicas(Arc<AtomicU32>);

impl Replicas {
    /// One replica (until told otherwise).
    pub fn one() -> Self {
        Self(Arc::new(AtomicU32::new(1)))
    }

    /// Records `count` live replicas (0 counts as 1).
    pub fn set(&self, count: u32) {
        self.0.store(count.max(1), Ordering::Relaxed);
    }

    /// Live replicas.
    pub fn count(&self) -> u32 {
        self.0.load(Ordering::Relaxed).max(1)
    }
}

impl Default for Replicas {
    fn default() -> Self {
        Self::one()
    }
}

/// A FIFO-fair token bucket: each caller reserves a token (the balance may go negative) and sleeps
/// until its token is due, so the lock is never held across an await. Its rate is divided
/// between the live [`Replicas`] (the burst too, so together they stay under the server's
/// limit).
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    replicas: Replicas,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A bucket refilling `rate_per_sec` tokens per second up to `burst`, starting full.
    /// Non-positive or non-finite rates fall back to [`DEFAULT_READ_RATE`]; a zero burst counts
    /// as 1.
    pub fn new(rate_per_sec: f64, burst: u32) -> Self {
        Self::shared(rate_per_sec, burst, Replicas::one())
    }

    /// [`Self::new`], the rate and burst divided between `replicas`.
    pub fn shared(rate_per_sec: f64, burst: u32, replicas: Replicas) -> Self {
        let rate = if rate_per_sec.is_finite() && rate_per_sec > 0.0 {
            rate_per_sec
        } else {
            DEFAULT_READ_RATE
        };
        let burst = f64::from(burst.max(1));
        Self {
            rate,
            burst,
            replicas,
            state: Mutex::new(BucketState {
                tokens: burst,
                last: Instant::now(),
            }),
        }
    }

    /// Tokens per second of this replica: its share of the rate.
    pub fn rate(&self) -> f64 {
        self.rate / f64::from(self.replicas.count())
    }

    /// This replica's share of the burst (at least one token).
    fn burst(&self) -> f64 {
        (self.burst / f64::from(self.replicas.count())).max(1.0)
    }

    /// Waits until a token is available and takes it. If the future is dropped while waiting,
    /// the reserved token is not returned (the bucket errs on the slow side).
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Whether the bucket has refilled to its burst (no caller waits or has spent a token
    /// since): it then behaves as a new bucket would.
    pub fn is_full(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = Instant::now()
            .saturating_duration_since(state.last)
            .as_secs_f64();
        state.tokens + elapsed * self.rate() >= self.burst()
    }

    /// Takes a token now and returns how long the caller must wait before using it.
    fn reserve(&self) -> Duration {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(state.last).as_secs_f64();
        let rate = self.rate();
        state.tokens = (state.tokens + elapsed * rate).min(self.burst());
        state.last = now;
        state.tokens -= 1.0;
        if state.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-state.tokens / rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate() {
        let bucket = TokenBucket::new(10.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            bucket.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is immediate");
        for _ in 0..10 {
            bucket.acquire().await;
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(999) && elapsed <= Duration::from_millis(1001),
            "10 more tokens at 10/s take 1 s, took {elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn replicas_divide_the_rate_and_the_burst() {
        // (live replicas, time for 20 tokens from a full bucket of 40/s, burst 10).
        let cases = [(1, 250), (2, 750), (4, 1750)];
        for (count, millis) in cases {
            let replicas = Replicas::one();
            replicas.set(count);
            let bucket = TokenBucket::shared(40.0, 10, replicas);
            let start = Instant::now();
            for _ in 0..20 {
                bucket.acquire().await;
            }
            let elapsed = start.elapsed().as_millis();
            assert!(
                elapsed.abs_diff(millis) <= 1,
                "{count} replicas: 20 tokens took {elapsed} ms, not {millis}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refills_after_idle_up_to_burst() {
        let bucket = TokenBucket::new(5.0, 2);
        bucket.acquire().await;
        bucket.acquire().await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let start = Instant::now();
        bucket.acquire().await;
        bucket.acquire().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        bucket.acquire().await;
        assert_eq!(start.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_the_rate() {
        let bucket = Arc::new(TokenBucket::new(40.0, 10));
        let start = Instant::now();
        let tasks: Vec<_> = (0..90)
            .map(|_| {
                let bucket = Arc::clone(&bucket);
                tokio::spawn(async move { bucket.acquire().await })
            })
            .collect();
        for task in tasks {
            assert!(task.await.is_ok());
        }
        // 10 from the burst, 80 more at 40/s.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(1999) && elapsed <= Duration::from_millis(2001),
            "took {elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn full_once_refilled_to_the_burst() {
        let bucket = TokenBucket::new(4.0, 2);
        assert!(bucket.is_full(), "a new bucket is full");
        bucket.acquire().await;
        assert!(!bucket.is_full(), "one of two tokens spent");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(!bucket.is_full(), "0.8 of a token back");
        tokio::time::advance(Duration::from_millis(60)).await;
        assert!(bucket.is_full(), "a whole token back after 250 ms at 4/s");
    }

    #[test]
    fn bad_rate_falls_back() {
        assert_eq!(TokenBucket::new(0.0, 0).rate(), DEFAULT_READ_RATE);
        assert_eq!(TokenBucket::new(f64::NAN, 1).rate(), DEFAULT_READ_RATE);
    }
}
