//! Request limits, all checked before a key is looked up (GCRA, the
//! `governor` crate); over a limit: 429 `rate_limited` with `Retry-After`.
//!
//! - [`KeyRateLimiter`]: requests per presented API key.
//! - [`AuthFailureGuard`]: authentication failures per client address. A
//!   client that keeps presenting unknown, wrong or revoked keys is
//!   answered 429 before any database lookup after a small burst of
//!   failures, while keys this replica has recently verified keep working
//!   from the same address.
//!
//! Every map here is bounded (`TRACKED_MAX` entries): under a flood of
//! distinct keys or addresses, idle entries are dropped, and past the bound
//! new ones share one overflow entry, so memory stays flat.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use ipnet::IpNet;

/// Most entries any limiter or map here keeps.
pub const TRACKED_MAX: usize = 100_000;

/// How long a verified key is remembered as good for its address.
const VERIFIED_KEY_MEMORY: Duration = Duration::from_secs(600);

/// `Err(seconds to wait)` from a keyed limiter, bounded in size: idle keys
/// are forgotten when it is full, and past the bound new keys share
/// `overflow`'s quota.
fn check_bounded<K>(
    limiter: &DefaultKeyedRateLimiter<K>,
    clock: &DefaultClock,
    key: K,
    overflow: K,
) -> Result<(), u64>
where
    K: Clone + std::hash::Hash + Eq,
{
    if limiter.len() >= TRACKED_MAX {
        limiter.retain_recent();
    }
    let key = if limiter.len() >= TRACKED_MAX {
        overflow
    } else {
        key
    };
    limiter.check_key(&key).map_err(|not_until| {
        let wait = not_until.wait_time_from(clock.now());
        wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
    })
}

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
        check_bounded(limiter, &self.clock, key.to_owned(), "overflow".to_owned())
    }

    /// Keys tracked now (for the memory benchmark).
    pub fn tracked(&self) -> usize {
        self.limiter.as_ref().map_or(0, |limiter| limiter.len())
    }

    /// Forgets keys that are back to a full quota (bounded memory).
    pub fn forget_idle(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

/// Authentication failures per client address.
pub struct AuthFailureGuard {
    failures: Option<DefaultKeyedRateLimiter<IpAddr>>,
    clock: DefaultClock,
    trusted_proxies: Vec<IpNet>,
    /// Addresses over their failure quota, and until when.
    blocked: Mutex<HashMap<IpAddr, Instant>>,
    /// Key ids this replica verified recently (they pass a blocked address).
    verified: Mutex<HashMap<String, Instant>>,
}

/// The address that stands for all new ones once the maps are full.
const OVERFLOW_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

impl AuthFailureGuard {
    /// `burst` failures at once, then one per `per_minute`-th of a minute;
    /// `burst` = 0 disables the guard.
    pub fn new(burst: u32, per_minute: u32, trusted_proxies: Vec<IpNet>) -> AuthFailureGuard {
        let failures = NonZeroU32::new(burst).map(|burst| {
            let rate = NonZeroU32::new(per_minute.max(1)).unwrap_or(NonZeroU32::MIN);
            DefaultKeyedRateLimiter::keyed(Quota::per_minute(rate).allow_burst(burst))
        });
        AuthFailureGuard {
            failures,
            clock: DefaultClock::default(),
            trusted_proxies,
            blocked: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
        }
    }

    fn trusted(&self, address: IpAddr) -> bool {
        self.trusted_proxies
            .iter()
            .any(|network| network.contains(&address))
    }

    /// The client's address: the peer's, or — when the peer is a trusted
    /// proxy — the nearest `X-Forwarded-For` hop (read from the right) that
    /// is not a trusted proxy. Hops left of it could be anything the client
    /// wrote, so they are never believed.
    pub fn client_address(
        &self,
        peer: Option<IpAddr>,
        forwarded_for: Option<&str>,
    ) -> Option<IpAddr> {
        let peer = peer?;
        if !self.trusted(peer) {
            return Some(peer);
        }
        let Some(forwarded_for) = forwarded_for else {
            return Some(peer);
        };
        let mut client = peer;
        for hop in forwarded_for.rsplit(',') {
            let Ok(address) = hop.trim().parse::<IpAddr>() else {
                break;
            };
            client = address;
            if !self.trusted(address) {
                break;
            }
        }
        Some(client)
    }

    /// Before any lookup: `Err(seconds to wait)` when `client` is blocked
    /// and the presented key is not one this replica verified recently.
    pub fn admit(&self, client: IpAddr, key_id: Option<&str>) -> Result<(), u64> {
        if self.failures.is_none() {
            return Ok(());
        }
        let now = Instant::now();
        if let Some(id) = key_id {
            let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            if verified
                .get(id)
                .is_some_and(|at| now.duration_since(*at) < VERIFIED_KEY_MEMORY)
            {
                return Ok(());
            }
        }
        let blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        match blocked.get(&client) {
            Some(until) if *until > now => {
                let wait = *until - now;
                Err(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
            }
            _ => Ok(()),
        }
    }

    /// After the answer: a 401 counts against the client's quota (over it,
    /// the client is blocked until the quota refills); a success on `/v1`
    /// marks the key as verified.
    pub fn record(&self, client: IpAddr, key_id: Option<&str>, status: u16) {
        let Some(failures) = &self.failures else {
            return;
        };
        if status == 401 {
            if let Err(wait) = check_bounded(failures, &self.clock, client, OVERFLOW_ADDRESS) {
                let mut blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
                bounded_insert(
                    &mut blocked,
                    client,
                    Instant::now() + Duration::from_secs(wait),
                );
            }
        } else if (200..300).contains(&status) {
            if let Some(id) = key_id {
                let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
                bounded_insert(&mut verified, id.to_owned(), Instant::now());
            }
        }
    }

    /// Forgets what no longer matters (called periodically).
    pub fn forget_idle(&self) {
        let now = Instant::now();
        if let Some(failures) = &self.failures {
            failures.retain_recent();
            failures.shrink_to_fit();
        }
        self.blocked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, until| *until > now);
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, at| now.duration_since(*at) < VERIFIED_KEY_MEMORY);
    }

    /// Entries tracked now: (failure quotas, blocked, verified keys).
    pub fn tracked(&self) -> (usize, usize, usize) {
        (
            self.failures.as_ref().map_or(0, |failures| failures.len()),
            self.blocked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
            self.verified
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
        )
    }
}

/// Inserts into a map of at most `TRACKED_MAX` entries: when it is full,
/// lapsed entries go first; if it is still full, the new entry is dropped.
fn bounded_insert<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Instant>, key: K, at: Instant) {
    if map.len() >= TRACKED_MAX && !map.contains_key(&key) {
        let now = Instant::now();
        map.retain(|_, when| *when > now || now.duration_since(*when) < VERIFIED_KEY_MEMORY);
        if map.len() >= TRACKED_MAX {
            return;
        }
    }
    map.insert(key, at);
}

/// The id part of a well-formed presented key (`tbk_<id>_<secret>`).
pub fn key_id_of(presented: &str) -> Option<&str> {
    presented
        .strip_prefix("tbk_")
        .and_then(|rest| rest.split_once('_'))
        .map(|(id, _)| id)
        .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The bucket a presented key counts against, without a database lookup:
/// the key id of a well-formed key, else one shared bucket.
pub fn bucket_of(presented: &str) -> String {
    key_id_of(presented).map_or_else(|| "unrecognised".to_owned(), |id| format!("key:{id}"))
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
    fn failures_block_an_address_but_not_a_verified_key() {
        let guard = AuthFailureGuard::new(5, 6, Vec::new());
        let client: IpAddr = "203.0.113.7".parse().expect("ip");
        let other: IpAddr = "203.0.113.8".parse().expect("ip");
        guard.record(client, Some("good"), 200);
        for _ in 0..5 {
            assert_eq!(guard.admit(client, Some("made-up")), Ok(()));
            guard.record(client, Some("made-up"), 401);
        }
        guard.record(client, Some("made-up"), 401);
        assert!(guard.admit(client, Some("made-up")).is_err());
        assert!(guard.admit(client, None).is_err());
        assert_eq!(guard.admit(client, Some("good")), Ok(()));
        assert_eq!(guard.admit(other, Some("made-up")), Ok(()));
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let proxies = vec!["10.0.0.0/8".parse().expect("cidr")];
        let guard = AuthFailureGuard::new(5, 6, proxies);
        let proxy: IpAddr = "10.1.2.3".parse().expect("ip");
        let stranger: IpAddr = "198.51.100.1".parse().expect("ip");
        let client = |peer, header| guard.client_address(Some(peer), header).expect("address");
        assert_eq!(client(stranger, Some("192.0.2.1")), stranger);
        assert_eq!(client(proxy, None), proxy);
        assert_eq!(
            client(proxy, Some("192.0.2.1")),
            "192.0.2.1".parse::<IpAddr>().expect("ip")
        );
        // A hop the client wrote itself, left of the real one, is ignored.
        assert_eq!(
            client(proxy, Some("1.1.1.1, 192.0.2.1, 10.9.9.9")),
            "192.0.2.1".parse::<IpAddr>().expect("ip")
        );
        assert_eq!(client(proxy, Some("garbage")), proxy);
    }

    #[test]
    fn buckets() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(bucket_of(&format!("tbk_{id}_secret")), format!("key:{id}"));
        assert_eq!(bucket_of("garbage"), "unrecognised");
        assert_eq!(bucket_of("tbk_short_x"), "unrecognised");
    }
}
