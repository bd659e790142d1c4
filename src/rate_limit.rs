//! Per-API-key request rate limit (GCRA, the `governor` crate), checked
//! before the key is even looked up, so a flood of requests — with a real
//! key or with garbage — cannot reach the database faster than the quota.
//! Over the limit: 429 `rate_limited` with `Retry-After`.

use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

pub struct KeyRateLimiter {
    limiter: Option<DefaultKeyedRateLimiter<String>>,
    clock: DefaultClock,
}

impl KeyRateLimiter {
    /// `per_second` = 0 disables the limit.
    pub fn new(per_second: u32, burst: u32) -> KeyRateLimiter {
        let limiter = NonZeroU32::new(per_second).map(|rate| {
            let burst = NonZeroU32::new(burst.max(per_second)).unwrap_or(rate);
            DefaultKeyedRateLimiter::keyed(Quota::per_second(rate).allow_burst(burst))
        });
        KeyRateLimiter {
            limiter,
            clock: DefaultClock::default(),
        }
    }

    /// `Err(seconds to wait)` when `key` is over its quota.
    pub fn check(&self, key: &str) -> Result<(), u64> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter.check_key(&key.to_owned()).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
        })
    }

    /// Forgets keys that are back to a full quota (bounded memory).
    pub fn forget_idle(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

/// The bucket a presented key counts against, without a database lookup:
/// the key id of a well-formed key, else one shared bucket.
pub fn bucket_of(presented: &str) -> String {
    presented
        .strip_prefix("tbk_")
        .and_then(|rest| rest.split_once('_'))
        .map(|(id, _)| id)
        .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .map_or_else(|| "unrecognised".to_owned(), |id| format!("key:{id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_over_its_burst_waits_and_others_do_not() {
        let limiter = KeyRateLimiter::new(1, 3);
        for _ in 0..3 {
            assert_eq!(limiter.check("a"), Ok(()));
        }
        assert_eq!(limiter.check("a"), Err(1));
        assert_eq!(limiter.check("b"), Ok(()));
        let unlimited = KeyRateLimiter::new(0, 0);
        assert!((0..1000).all(|_| unlimited.check("a").is_ok()));
    }

    #[test]
    fn buckets() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(bucket_of(&format!("tbk_{id}_secret")), format!("key:{id}"));
        assert_eq!(bucket_of("garbage"), "unrecognised");
        assert_eq!(bucket_of("tbk_short_x"), "unrecognised");
    }
}
