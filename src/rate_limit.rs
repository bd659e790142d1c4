//! Request limits (GCRA, the `governor` crate); over a limit: 429
//! `rate_limited` with `Retry-After`.
//!
//! A key's id is printed in places (the audit log, finance's ledger), so an
//! id alone must open nothing and cost its owner nothing:
//!
//! - [`KeyRateLimiter`]: requests per API key, charged only once the key's
//!   secret is verified — against this replica's memory of verified keys
//!   (no lookup), or else by the database first. A flood of
//!   `tbk_<someone's id>_<made-up secret>` never touches that key's bucket.
//! - [`AuthFailureGuard`]: authentication failures per client address. A
//!   client that keeps presenting unknown, wrong or revoked keys is
//!   answered 429 before any database lookup after `AUTH_FAILURE_BURST`
//!   failures; from a blocked address only a key whose secret matches one
//!   this replica verified (a constant-time compare of the SHA-256 held in
//!   memory) still gets through.
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
use governor::middleware::StateInformationMiddleware;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ipnet::IpNet;
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// Most entries any limiter or map here keeps.
pub const TRACKED_MAX: usize = 100_000;

/// How long a verified key is remembered.
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

/// What this replica remembers of a key it verified: the SHA-256 of its
/// secret (a key's secret never changes, so a presented secret that does
/// not match is wrong without asking the database) and when.
struct Remembered {
    secret_hash: [u8; 32],
    at: Instant,
}

/// What this replica knows about a presented key before any database
/// lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    /// Its secret matches the one remembered for its id (compared in
    /// constant time): whoever presents it holds the key.
    Verified,
    /// Its id is remembered with another secret: the key is wrong.
    WrongSecret,
    /// Nothing remembered: only the database can tell.
    Unknown,
}

/// A presented key as the guard sees it: its id and its secret's hash.
pub type PresentedKey = (Uuid, [u8; 32]);

/// Authentication failures per client address, and the memory of keys
/// this replica has verified.
pub struct AuthFailureGuard {
    failures: Option<FailureLimiter>,
    /// How long an address stays blocked once over its failure quota.
    block_for: Duration,
    trusted_proxies: Vec<IpNet>,
    /// Addresses over their failure quota, and until when.
    blocked: Mutex<HashMap<IpAddr, Instant>>,
    /// Keys this replica verified recently: they pass a blocked address,
    /// and only they are charged to their own rate bucket.
    verified: Mutex<HashMap<Uuid, Remembered>>,
}

type FailureLimiter = DefaultKeyedRateLimiter<IpAddr, StateInformationMiddleware>;

/// The address that stands for all new ones once the maps are full.
const OVERFLOW_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// Whole seconds to wait, rounded up.
fn seconds_until(until: Instant, now: Instant) -> u64 {
    let wait = until.saturating_duration_since(now);
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

impl AuthFailureGuard {
    /// `burst` failures, then blocked until one more is allowed, at
    /// `per_minute` per minute; `burst` = 0 disables the throttle (the
    /// memory of verified keys still serves the rate limit).
    pub fn new(burst: u32, per_minute: u32, trusted_proxies: Vec<IpNet>) -> AuthFailureGuard {
        let rate = NonZeroU32::new(per_minute.max(1)).unwrap_or(NonZeroU32::MIN);
        let quota = NonZeroU32::new(burst).map(|burst| Quota::per_minute(rate).allow_burst(burst));
        AuthFailureGuard {
            failures: quota.map(|quota| {
                RateLimiter::keyed(quota).with_middleware::<StateInformationMiddleware>()
            }),
            block_for: Quota::per_minute(rate).replenish_interval(),
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

    /// What this replica knows of a presented key, from memory only.
    pub fn recognise(&self, (id, secret_hash): &PresentedKey) -> Known {
        let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        match verified.get(id) {
            Some(remembered) if remembered.at.elapsed() < VERIFIED_KEY_MEMORY => {
                if bool::from(remembered.secret_hash.ct_eq(secret_hash)) {
                    Known::Verified
                } else {
                    Known::WrongSecret
                }
            }
            _ => Known::Unknown,
        }
    }

    /// The database has just verified this key (id and secret).
    pub fn remember(&self, (id, secret_hash): &PresentedKey) {
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if verified.len() >= TRACKED_MAX && !verified.contains_key(id) {
            verified.retain(|_, remembered| remembered.at.elapsed() < VERIFIED_KEY_MEMORY);
            if verified.len() >= TRACKED_MAX {
                return;
            }
        }
        verified.insert(
            *id,
            Remembered {
                secret_hash: *secret_hash,
                at: Instant::now(),
            },
        );
    }

    /// The database refused a key this replica remembered (revoked or
    /// expired since): forget it. Only a caller holding the right secret
    /// gets here, so nobody else can make the replica forget a key.
    pub fn forget(&self, id: &Uuid) {
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// Before any lookup: `Err(seconds to wait)` when `client` is blocked,
    /// unless the presented key's secret matches one this replica verified
    /// (memory only, no database lookup). A key id alone opens nothing.
    pub fn admit(&self, client: IpAddr, presented: Option<&PresentedKey>) -> Result<(), u64> {
        if self.failures.is_none() {
            return Ok(());
        }
        let now = Instant::now();
        let until = {
            let blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
            match blocked.get(&client) {
                Some(until) if *until > now => *until,
                _ => return Ok(()),
            }
        };
        if presented.is_some_and(|key| self.recognise(key) == Known::Verified) {
            return Ok(());
        }
        Err(seconds_until(until, now))
    }

    /// After the answer: a 401 counts against the client's quota; the
    /// failure that uses its last allowance blocks the client until the
    /// quota lets one more through (so `burst` failures, then 429).
    pub fn record(&self, client: IpAddr, status: u16) {
        let Some(failures) = &self.failures else {
            return;
        };
        if status != 401 {
            return;
        }
        if failures.len() >= TRACKED_MAX {
            failures.retain_recent();
        }
        let client = if failures.len() >= TRACKED_MAX {
            OVERFLOW_ADDRESS
        } else {
            client
        };
        let now = Instant::now();
        let until = match failures.check_key(&client) {
            Ok(snapshot) if snapshot.remaining_burst_capacity() > 0 => return,
            Ok(_) => now + self.block_for,
            Err(not_until) => {
                now + not_until
                    .wait_time_from(DefaultClock::default().now())
                    .max(Duration::from_millis(1))
            }
        };
        let mut blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        if blocked.len() >= TRACKED_MAX && !blocked.contains_key(&client) {
            blocked.retain(|_, until| *until > now);
            if blocked.len() >= TRACKED_MAX {
                return;
            }
        }
        blocked.insert(client, until);
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
            .retain(|_, remembered| remembered.at.elapsed() < VERIFIED_KEY_MEMORY);
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

/// The rate bucket of a key: charged only once its secret is verified.
pub fn bucket_of(id: &Uuid) -> String {
    format!("key:{}", id.simple())
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
    fn failures_block_an_address_at_the_burst_but_not_a_verified_key() {
        let guard = AuthFailureGuard::new(5, 6, Vec::new());
        let client: IpAddr = "203.0.113.7".parse().expect("ip");
        let other: IpAddr = "203.0.113.8".parse().expect("ip");
        let good: PresentedKey = (Uuid::new_v4(), [7; 32]);
        let good_id_wrong_secret: PresentedKey = (good.0, [8; 32]);
        let made_up: PresentedKey = (Uuid::new_v4(), [9; 32]);
        guard.remember(&good);
        for failure in 0..5 {
            assert_eq!(guard.admit(client, Some(&made_up)), Ok(()), "{failure}");
            guard.record(client, 401);
        }
        // Five failures (the burst) and the sixth request is refused.
        assert!(guard.admit(client, Some(&made_up)).is_err());
        assert!(guard.admit(client, None).is_err());
        assert_eq!(guard.admit(client, Some(&good)), Ok(()));
        // The id of a verified key with another secret opens nothing.
        assert!(guard.admit(client, Some(&good_id_wrong_secret)).is_err());
        assert_eq!(guard.admit(other, Some(&made_up)), Ok(()));
    }

    #[test]
    fn the_memory_knows_a_key_by_its_secret_not_its_id() {
        let guard = AuthFailureGuard::new(0, 0, Vec::new());
        let key: PresentedKey = (Uuid::new_v4(), [1; 32]);
        assert_eq!(guard.recognise(&key), Known::Unknown);
        guard.remember(&key);
        assert_eq!(guard.recognise(&key), Known::Verified);
        assert_eq!(guard.recognise(&(key.0, [2; 32])), Known::WrongSecret);
        assert_eq!(guard.recognise(&(Uuid::new_v4(), [1; 32])), Known::Unknown);
        guard.forget(&key.0);
        assert_eq!(guard.recognise(&key), Known::Unknown);
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
        let id: Uuid = "0123456789abcdef0123456789abcdef".parse().expect("uuid");
        assert_eq!(bucket_of(&id), "key:0123456789abcdef0123456789abcdef");
    }
}
