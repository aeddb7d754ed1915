//! Token bucket that limits worker-deployment reads per Temporal namespace.
//!
//! The server limits worker-deployment reads (`DescribeWorkerDeployment`,
//! `DescribeWorkerDeploymentVersion`, `DescribeTaskQueue`, ...) per namespace
//! (`frontend.globalNamespaceWorkerDeploymentReadRPS`, default 50/s). Every read of this module
//! first takes a token from the bucket of its (server, namespace), so many rollouts at once queue
//! here instead of tripping the server's limit. The bucket is `governor`'s (GCRA) on tokio's
//! clock.

use std::{
    num::NonZeroU32,
    ops::Add,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use governor::{
    Quota, RateLimiter,
    clock::{Clock, Reference},
    middleware::NoOpMiddleware,
    nanos::Nanos,
    state::{InMemoryState, NotKeyed},
};
use tokio::time::Instant;

/// Default reads per second per Temporal namespace (the server's default limit is 50/s).
pub const DEFAULT_READ_RATE: f64 = 40.0;
/// Default burst: reads allowed at once after an idle period. In any one second the bucket
/// grants at most its rate plus its burst: 45 with the defaults, under the server's 50.
pub const DEFAULT_READ_BURST: u32 = 5;
// The defaults together stay under Temporal's limit in any second.
const _: () = assert!(DEFAULT_READ_RATE as u32 + DEFAULT_READ_BURST <= 45);

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

/// A token bucket (`governor`'s GCRA) whose rate and burst are divided between the live
/// [`Replicas`], so together they stay under the server's limit. A caller waits on tokio's
/// clock until its token is due.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: u32,
    replicas: Replicas,
    /// The limiter of this replica's share, the replica count it was made for, and when it
    /// last granted a token.
    state: Mutex<BucketState>,
    /// Callers in line for a token (tokio's mutex is fair: first come, first served). Only the
    /// first waits on the limiter, so a token goes to the caller that waited longest, and one
    /// token wakes one caller, not every caller waiting.
    line: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct BucketState {
    replicas: u32,
    limiter: Arc<Limiter>,
    last_grant: Option<Instant>,
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<TokioInstant>>;

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
        let burst = burst.max(1);
        let count = replicas.count();
        Self {
            rate,
            burst,
            state: Mutex::new(BucketState {
                replicas: count,
                limiter: Arc::new(limiter(rate, burst, count)),
                last_grant: None,
            }),
            line: tokio::sync::Mutex::new(()),
            replicas,
        }
    }

    /// Tokens per second of this replica: its share of the rate.
    pub fn rate(&self) -> f64 {
        self.rate / f64::from(self.replicas.count())
    }

    /// This replica's share of the burst (at least one token).
    fn burst(&self) -> u32 {
        (self.burst / self.replicas.count()).max(1)
    }

    /// The limiter of the current replica count (a new one, starting full, when it changed).
    fn limiter(&self) -> Arc<Limiter> {
        let count = self.replicas.count();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.replicas != count {
            state.replicas = count;
            state.limiter = Arc::new(limiter(self.rate, self.burst, count));
        }
        Arc::clone(&state.limiter)
    }

    /// Waits until a token is available and takes it, after the callers that came first.
    pub async fn acquire(&self) {
        let _turn = self.line.lock().await;
        // The limiter is fetched on each try: the replica count may change while this waits.
        while let Err(not_until) = self.limiter().check() {
            tokio::time::sleep(not_until.wait_time_from(TokioClock.now())).await;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.last_grant = Some(Instant::now());
    }

    /// Whether the bucket has surely refilled to its burst (no token granted for as long as a
    /// whole burst takes to come back): it then behaves as a new bucket would. Callers still
    /// waiting hold the bucket (see the pool's eviction), so only grants count here.
    pub fn is_full(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.last_grant.is_none_or(|granted| {
            let refill = Duration::from_secs_f64(f64::from(self.burst()) / self.rate());
            Instant::now().saturating_duration_since(granted) >= refill
        })
    }
}

/// A limiter of `count` replicas' share of `rate` and `burst` (at least one token).
fn limiter(rate: f64, burst: u32, count: u32) -> Limiter {
    let share = rate / f64::from(count);
    let period = Duration::from_secs_f64(1.0 / share);
    let burst = NonZeroU32::new(burst / count).unwrap_or(NonZeroU32::MIN);
    let quota = Quota::with_period(period)
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
        .allow_burst(burst);
    RateLimiter::direct_with_clock(quota, TokioClock)
}

/// Tokio's clock for `governor`, so the bucket follows paused time in tests.
#[derive(Debug, Clone, Copy)]
struct TokioClock;

impl Clock for TokioClock {
    type Instant = TokioInstant;

    fn now(&self) -> TokioInstant {
        TokioInstant(Instant::now())
    }
}

/// A tokio instant as a `governor` clock reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct TokioInstant(Instant);

impl Add<Nanos> for TokioInstant {
    type Output = Self;

    fn add(self, nanos: Nanos) -> Self {
        Self(self.0 + Duration::from(nanos))
    }
}

impl Reference for TokioInstant {
    fn duration_since(&self, earlier: Self) -> Nanos {
        self.0.saturating_duration_since(earlier.0).into()
    }

    fn saturating_sub(&self, duration: Nanos) -> Self {
        self.0.checked_sub(duration.into()).map_or(*self, Self)
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
        // (live replicas, time for 20 tokens from a full bucket of 40/s, burst 10): each
        // replica's burst is its whole share of tokens (4 replicas: 2 each, at 10/s).
        let cases = [(1, 250), (2, 750), (4, 1800)];
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

    /// Tokens go to callers in the order they came: a caller arriving as a token falls due
    /// does not take it from one that was already waiting for it (and only the first in line
    /// waits on the limiter, instead of every waiter waking for every token).
    #[tokio::test(start_paused = true)]
    async fn a_caller_arriving_as_a_token_falls_due_does_not_take_it_from_one_waiting() {
        use futures::FutureExt;

        let bucket = Arc::new(TokenBucket::new(1.0, 1));
        bucket.acquire().await;
        let waiting = tokio::spawn({
            let bucket = Arc::clone(&bucket);
            async move { bucket.acquire().await }
        });
        // The waiting caller runs until it sleeps for the next token.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            bucket.acquire().now_or_never().is_none(),
            "the token due now is the waiting caller's"
        );
        assert!(waiting.await.is_ok());
        let start = Instant::now();
        bucket.acquire().await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "the next token is a second later"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn full_once_a_whole_burst_could_have_refilled() {
        let bucket = TokenBucket::new(4.0, 2);
        assert!(bucket.is_full(), "a new bucket is full");
        bucket.acquire().await;
        assert!(!bucket.is_full(), "one of two tokens spent");
        tokio::time::advance(Duration::from_millis(490)).await;
        assert!(
            !bucket.is_full(),
            "a burst of 2 at 4/s takes 500 ms to come back"
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        assert!(bucket.is_full(), "500 ms after the last grant");
    }

    #[test]
    fn bad_rate_falls_back() {
        assert_eq!(TokenBucket::new(0.0, 0).rate(), DEFAULT_READ_RATE);
        assert_eq!(TokenBucket::new(f64::NAN, 1).rate(), DEFAULT_READ_RATE);
    }
}
