//! Sizes and seeded randomness of the chaos tests. Sizes come from environment variables with
//! small defaults (`make test`); `make chaos` raises them. The seed (`CHAOS_SEED`) is printed so
//! that a failing schedule can be replayed.

use std::time::Duration;

/// Seed used when `CHAOS_SEED` is not set, so `make test` always plays the same schedule.
const DEFAULT_SEED: u64 = 20_261_121;

/// A size or count from the environment, `default` when unset or unparsable.
pub fn env_count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The chaos seed (`CHAOS_SEED`), printed with the test that uses it.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("{test}: CHAOS_SEED={seed} (set it to replay this schedule)");
    seed
}

/// SplitMix64: small, fast and reproducible across platforms (no dependency needed).
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// A duration in `low..=high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.between(low, high))
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let index = usize::try_from(self.next_u64() % items.len() as u64).unwrap_or(0);
        &items[index]
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<u64> = (0..5).map(|_| a.between(10, 20)).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.between(10, 20)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (10..=20).contains(x)), "{xs:?}");
    }
}
