//! Request limits; over a limit: 429 `rate_limited` with `Retry-After`.
//!
//! A key's id is printed in places (the audit log, finance's ledger), so an
//! id alone must open nothing and cost its owner nothing:
//!
//! - [`KeyRateLimiter`]: requests per API key (GCRA, the `governor`
//!   crate), charged only once the key's secret is verified — against
//!   this replica's memory of verified keys (no lookup), or else by the
//!   database first. A flood of `tbk_<someone's id>_<made-up secret>`
//!   never touches that key's bucket.
//! - [`AuthFailureGuard`]: authentication failures per client (an IPv4
//!   address, or an IPv6 network of `AUTH_FAILURE_IPV6_PREFIX` bits). A
//!   client that keeps presenting unknown, wrong or revoked keys — the
//!   bootstrap admin key's guesses included — is answered 429 before any
//!   database lookup after `AUTH_FAILURE_BURST` failures; a request with
//!   no key is never a failure. From a blocked client only a key whose
//!   secret matches one this replica verified and has seen in use since (a
//!   constant-time compare of the SHA-256 held in memory, refreshed by each
//!   request with that secret) still gets through. docs/security.md, "The
//!   address throttle", states the rules.
//!
//! Every map here is bounded: the failure table forgets an entry only once
//! its failures have drained (so no flood of addresses unblocks anyone),
//! and past its bound new clients share one overflow entry; the memory of
//! verified keys has a bound of its own; the key limiter forgets idle keys
//! and past its bound lets new ones share one overflow entry.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use ipnet::{IpNet, Ipv6Net};
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// Most entries any limiter or map here keeps by default.
pub const TRACKED_MAX: usize = 100_000;

/// A full failure table is swept for drained entries at most this often
/// (a sweep reads every entry).
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How long a verified key is remembered by default
/// (`AUTH_VERIFIED_KEY_MEMORY_SECONDS`).
pub const VERIFIED_KEY_MEMORY: Duration = Duration::from_secs(600);

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
/// not match is wrong without asking the database) and when it was last
/// proven (verified by the database, or presented with that secret).
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

/// What a request presents, as the guard classifies it before any lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presented {
    /// No `Authorization` header: only the answer tells whether the route
    /// needed one.
    Nothing,
    /// The bootstrap `ADMIN_API_KEY` (compared in constant time).
    Bootstrap,
    /// A well-formed API key: its id and its secret's hash.
    Key(PresentedKey),
    /// A key that is neither the bootstrap key nor well formed: certainly
    /// a failure, whatever the database holds.
    Refused,
}

/// Which header a trusted proxy names the client in (`FORWARDED_HEADER`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, …` (every header line, in order).
    #[default]
    #[value(name = "x-forwarded-for")]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for=proxy1`.
    #[value(name = "forwarded")]
    Forwarded,
}

impl ForwardedHeader {
    /// The header's name, lower case.
    pub fn name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }
}

/// The address throttle's settings (`config.rs` holds their defaults).
#[derive(Clone, Debug)]
pub struct GuardSettings {
    /// Failures an address may cause at once; 0 disables the throttle.
    pub burst: u32,
    /// Failures an address regains per minute.
    pub per_minute: u32,
    /// Proxies whose forwarding header is believed.
    pub trusted_proxies: Vec<IpNet>,
    pub forwarded_header: ForwardedHeader,
    /// IPv6 clients are counted per network of this prefix length.
    pub ipv6_prefix: u8,
    /// Most addresses (or IPv6 networks) tracked at once.
    pub tracked_max: usize,
    /// Most verified keys remembered at once.
    pub verified_keys_max: usize,
    /// How long a verified key is remembered after its last proof.
    pub verified_key_memory: Duration,
}

impl GuardSettings {
    /// The throttle with `burst` and `per_minute`, other settings default.
    pub fn new(burst: u32, per_minute: u32) -> GuardSettings {
        GuardSettings {
            burst,
            per_minute,
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::XForwardedFor,
            ipv6_prefix: 64,
            tracked_max: TRACKED_MAX,
            verified_keys_max: TRACKED_MAX,
            verified_key_memory: VERIFIED_KEY_MEMORY,
        }
    }
}

/// One client address (or IPv6 network) with failures: how many are
/// outstanding (they drain at `per_minute`), when that was computed, and
/// until when it is blocked.
#[derive(Clone, Copy, Debug)]
struct Offender {
    level: f64,
    updated: Instant,
    blocked_until: Option<Instant>,
}

impl Offender {
    /// Outstanding failures at `now`.
    fn level_at(&self, now: Instant, per_second: f64) -> f64 {
        let drained = now.saturating_duration_since(self.updated).as_secs_f64() * per_second;
        (self.level - drained).max(0.0)
    }

    fn blocked_at(&self, now: Instant) -> Option<Instant> {
        self.blocked_until.filter(|until| *until > now)
    }

    /// Forgettable: nothing outstanding and not blocked.
    fn idle_at(&self, now: Instant, per_second: f64) -> bool {
        self.blocked_at(now).is_none() && self.level_at(now, per_second) <= 0.0
    }
}

impl Default for Offender {
    fn default() -> Offender {
        Offender {
            level: 0.0,
            updated: Instant::now(),
            blocked_until: None,
        }
    }
}

/// Where a client's failures are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Its own entry (held already, or there is room for it).
    Own(IpAddr),
    /// The table is full of clients whose failures have not drained: the
    /// one entry every other client shares.
    Overflow,
}

/// The failure table: one entry per client with failures that have not
/// drained, at most `tracked_max`, and the entry shared by the clients
/// that found it full.
struct Offenders {
    entries: HashMap<IpAddr, Offender>,
    overflow: Offender,
    /// When a full table was last swept for drained entries.
    swept: Option<Instant>,
}

impl Offenders {
    /// Where `subject`'s failures are counted at `now`. An entry is only
    /// ever forgotten once its failures have drained — never to make room
    /// — so a flood of new addresses can neither unblock a client nor
    /// give it back its burst: past the bound, the newcomers share one
    /// entry instead.
    fn slot(&mut self, subject: IpAddr, now: Instant, per_second: f64, max: usize) -> Slot {
        if self.entries.len() < max || self.entries.contains_key(&subject) {
            return Slot::Own(subject);
        }
        if self
            .swept
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_INTERVAL)
        {
            self.entries
                .retain(|_, offender| !offender.idle_at(now, per_second));
            self.swept = Some(now);
        }
        if self.entries.len() < max {
            Slot::Own(subject)
        } else {
            Slot::Overflow
        }
    }

    /// The entry of `slot`, if it has one yet.
    fn get(&self, slot: Slot) -> Option<&Offender> {
        match slot {
            Slot::Own(subject) => self.entries.get(&subject),
            Slot::Overflow => Some(&self.overflow),
        }
    }

    /// The entry of `slot`, made when missing.
    fn get_mut(&mut self, slot: Slot) -> &mut Offender {
        match slot {
            Slot::Own(subject) => self.entries.entry(subject).or_default(),
            Slot::Overflow => &mut self.overflow,
        }
    }
}

/// How the guard admitted a request, and what its answer still decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// A certain failure, counted already (before its answer).
    Counted,
    /// A key or the bootstrap key: a 401 answer counts ([`record`]).
    ///
    /// [`record`]: AuthFailureGuard::record
    ByTheAnswer,
    /// No key: never a failure, whatever the answer (a web page on a
    /// guest's phone sends such requests by the dozen).
    NotCounted,
}

/// Authentication failures per client address, and the memory of keys
/// this replica has verified.
///
/// The failure table is bounded (`tracked_max`) and never fails open: an
/// entry is forgotten only once its failures have drained, and when the
/// table is full of entries that have not, every client it does not hold
/// is counted in one shared entry (of the same burst), so those clients
/// are the ones refused — unless they present a key this replica
/// remembers. The memory of verified keys is bounded apart
/// (`verified_keys_max`): failures from any number of addresses never
/// crowd a key out of it.
pub struct AuthFailureGuard {
    settings: GuardSettings,
    /// Failures drained per second.
    per_second: f64,
    offenders: Mutex<Offenders>,
    /// Keys this replica verified recently: they pass a blocked address,
    /// and only they are charged to their own rate bucket.
    verified: Mutex<HashMap<Uuid, Remembered>>,
}

/// Whole seconds to wait, rounded up.
fn seconds_until(until: Instant, now: Instant) -> u64 {
    let wait = until.saturating_duration_since(now);
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// One hop of a forwarding header, as the walk reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    /// An address (with or without a port).
    Address(IpAddr),
    /// A hop that says it hides the client: `unknown`, or an obfuscated
    /// name (`_hidden`), or a `Forwarded` element without `for=`. The walk
    /// stops there: a trusted proxy that hides its clients counts them as
    /// one.
    Hidden,
    /// Not a hop at all (a non-ASCII byte, garbage, a broken element):
    /// skipped.
    Malformed,
}

/// An address, with or without a port (`192.0.2.1:4711`,
/// `[2001:db8::1]:4711`, `[2001:db8::1]`).
fn parse_address(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|socket| socket.ip()))
        .or_else(|| {
            hop.strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|inner| inner.parse::<Ipv6Addr>().ok())
                .map(IpAddr::V6)
        })
}

/// One hop's bytes as text: trimmed, and only when printable ASCII (a
/// header value may carry any byte from 0x80 up; such a hop names
/// nothing).
fn hop_text(hop: &[u8]) -> Option<&str> {
    let hop = hop.trim_ascii();
    if hop.is_empty()
        || !hop
            .iter()
            .all(|byte| byte.is_ascii_graphic() || *byte == b' ')
    {
        return None;
    }
    std::str::from_utf8(hop).ok()
}

/// One hop of `X-Forwarded-For`.
fn parse_x_forwarded_for(hop: &[u8]) -> Hop {
    let Some(hop) = hop_text(hop) else {
        return Hop::Malformed;
    };
    if hop.eq_ignore_ascii_case("unknown") || hop.starts_with('_') {
        return Hop::Hidden;
    }
    parse_address(hop).map_or(Hop::Malformed, Hop::Address)
}

/// One element of RFC 7239 `Forwarded` (`for=…;proto=…`).
fn parse_forwarded(element: &[u8]) -> Hop {
    let Some(element) = hop_text(element) else {
        return Hop::Malformed;
    };
    match rfc7239::parse(element).next() {
        Some(Ok(element)) => match element.forwarded_for {
            Some(node) => node.ip().map_or(Hop::Hidden, |ip| Hop::Address(*ip)),
            None => Hop::Hidden,
        },
        _ => Hop::Malformed,
    }
}

impl AuthFailureGuard {
    /// `burst` failures, then blocked until one more is allowed, at
    /// `per_minute` per minute; `burst` = 0 disables the throttle (the
    /// memory of verified keys still serves the rate limit).
    pub fn new(settings: GuardSettings) -> AuthFailureGuard {
        let per_second = f64::from(settings.per_minute.max(1)) / 60.0;
        AuthFailureGuard {
            settings,
            per_second,
            offenders: Mutex::new(Offenders {
                entries: HashMap::new(),
                overflow: Offender::default(),
                swept: None,
            }),
            verified: Mutex::new(HashMap::new()),
        }
    }

    fn enabled(&self) -> bool {
        self.settings.burst > 0
    }

    fn trusted(&self, address: IpAddr) -> bool {
        self.settings
            .trusted_proxies
            .iter()
            .any(|network| network.contains(&address))
    }

    /// The forwarding header this guard reads (`FORWARDED_HEADER`).
    pub fn forwarded_header(&self) -> ForwardedHeader {
        self.settings.forwarded_header
    }

    /// The hops a forwarding header names, left (the client, as far as the
    /// first proxy knew) to right (the proxy nearest to us). Every header
    /// line counts, joined in order (RFC 9110 §5.3), and each is split at
    /// every comma, byte by byte: a hop is read alone, so one broken hop
    /// (a non-ASCII byte, an unclosed quote) spoils nothing but itself.
    fn hops<'a>(&self, lines: &'a [&'a [u8]]) -> impl DoubleEndedIterator<Item = Hop> + 'a {
        let parse = match self.settings.forwarded_header {
            ForwardedHeader::XForwardedFor => parse_x_forwarded_for,
            ForwardedHeader::Forwarded => parse_forwarded,
        };
        lines
            .iter()
            .flat_map(|line| line.split(|byte| *byte == b','))
            .filter(|hop| !hop.trim_ascii().is_empty())
            .map(parse)
    }

    /// The client's address: the peer's, or — when the peer is a trusted
    /// proxy — the right-most hop of the forwarding header that is not a
    /// trusted proxy. Hops left of it could be anything the client wrote,
    /// so they are never believed (nor parsed). A malformed hop is skipped;
    /// a hop that hides the client (`unknown`, an obfuscated name) stops
    /// the walk at the last trusted proxy, which hides its clients.
    pub fn client_address(&self, peer: Option<IpAddr>, lines: &[&[u8]]) -> Option<IpAddr> {
        let peer = peer?.to_canonical();
        if !self.trusted(peer) {
            return Some(peer);
        }
        let mut client = peer;
        for hop in self.hops(lines).rev() {
            match hop {
                Hop::Malformed => continue,
                Hop::Hidden => break,
                Hop::Address(address) => {
                    client = address.to_canonical();
                    if !self.trusted(client) {
                        break;
                    }
                }
            }
        }
        Some(client)
    }

    /// What failures are counted against: an IPv4 address, or the IPv6
    /// network of `ipv6_prefix` bits that holds the address (one host
    /// usually has a whole /64).
    pub fn subject(&self, client: IpAddr) -> IpAddr {
        match client.to_canonical() {
            IpAddr::V6(address) => {
                let prefix = self.settings.ipv6_prefix.min(128);
                Ipv6Net::new(address, prefix)
                    .map_or(IpAddr::V6(address), |network| IpAddr::V6(network.network()))
            }
            v4 => v4,
        }
    }

    /// What this replica knows of a presented key, from memory only. A
    /// match proves the key again: its memory is refreshed, so a key in
    /// use is never forgotten (only by its secret, never by its id alone).
    pub fn recognise(&self, (id, secret_hash): &PresentedKey) -> Known {
        let memory = self.settings.verified_key_memory;
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        match verified.get_mut(id) {
            Some(remembered) if remembered.at.elapsed() < memory => {
                if bool::from(remembered.secret_hash.ct_eq(secret_hash)) {
                    remembered.at = Instant::now();
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
        let memory = self.settings.verified_key_memory;
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if verified.len() >= self.settings.verified_keys_max && !verified.contains_key(id) {
            verified.retain(|_, remembered| remembered.at.elapsed() < memory);
            if verified.len() >= self.settings.verified_keys_max {
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

    /// Before any lookup. `Err(seconds to wait)` when the client is
    /// blocked (or, the table being full, the clients it does not hold
    /// are), unless it presents a key whose secret this replica verified
    /// (memory only; a key id alone opens nothing, and the bootstrap key,
    /// whose secret may be short, is never remembered: it is blocked like
    /// a guess). A key that is neither the bootstrap key nor well formed,
    /// or a remembered id with another secret, is a failure whatever the
    /// database holds: it is counted here, before its answer, so
    /// concurrent guesses cannot outrun the count ([`Admitted::Counted`]).
    pub fn admit(&self, client: IpAddr, presented: &Presented) -> Result<Admitted, u64> {
        let by_the_answer = match presented {
            Presented::Nothing => Admitted::NotCounted,
            _ => Admitted::ByTheAnswer,
        };
        if !self.enabled() {
            return Ok(by_the_answer);
        }
        let verified = match presented {
            Presented::Key(key) => self.recognise(key),
            _ => Known::Unknown,
        };
        let subject = self.subject(client);
        let now = Instant::now();
        let mut offenders = self
            .offenders
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let slot = offenders.slot(subject, now, self.per_second, self.settings.tracked_max);
        if let Some(until) = offenders.get(slot).and_then(|o| o.blocked_at(now)) {
            if verified == Known::Verified {
                return Ok(by_the_answer);
            }
            return Err(seconds_until(until, now));
        }
        let certain_failure =
            matches!(presented, Presented::Refused) || verified == Known::WrongSecret;
        if certain_failure {
            self.count(offenders.get_mut(slot), now);
            return Ok(Admitted::Counted);
        }
        Ok(by_the_answer)
    }

    /// After the answer of a request admitted [`Admitted::ByTheAnswer`]: a
    /// 401 counts against the client's quota; the failure that uses its
    /// last allowance blocks the client until the quota lets one more
    /// through (so `burst` failures, then 429).
    pub fn record(&self, client: IpAddr, status: u16) {
        if !self.enabled() || status != 401 {
            return;
        }
        let subject = self.subject(client);
        let now = Instant::now();
        let mut offenders = self
            .offenders
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let slot = offenders.slot(subject, now, self.per_second, self.settings.tracked_max);
        self.count(offenders.get_mut(slot), now);
    }

    /// One more failure for `offender`; blocks it at the burst.
    fn count(&self, offender: &mut Offender, now: Instant) {
        let level = offender.level_at(now, self.per_second) + 1.0;
        offender.level = level;
        offender.updated = now;
        // Blocked once less than one failure is left of the burst (the
        // level drains continuously, so "at the burst" is "above it less
        // one").
        let burst = f64::from(self.settings.burst);
        if level > burst - 1.0 {
            // Blocked until one failure has drained below the burst.
            let wait = (level - (burst - 1.0)) / self.per_second;
            let until = now + Duration::from_secs_f64(wait.max(0.001));
            offender.blocked_until = Some(offender.blocked_at(now).map_or(until, |u| u.max(until)));
        }
    }

    /// Forgets what no longer matters (called periodically).
    pub fn forget_idle(&self) {
        let now = Instant::now();
        let per_second = self.per_second;
        let mut offenders = self
            .offenders
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        offenders
            .entries
            .retain(|_, offender| !offender.idle_at(now, per_second));
        offenders.entries.shrink_to_fit();
        drop(offenders);
        let memory = self.settings.verified_key_memory;
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, remembered| remembered.at.elapsed() < memory);
    }

    /// Entries tracked now: (addresses with failures, blocked, verified keys).
    pub fn tracked(&self) -> (usize, usize, usize) {
        let now = Instant::now();
        let (tracked, blocked) = {
            let offenders = self
                .offenders
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let blocked = offenders
                .entries
                .values()
                .filter(|offender| offender.blocked_at(now).is_some())
                .count();
            (offenders.entries.len(), blocked)
        };
        let verified = self
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        (tracked, blocked, verified)
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

    fn guard(burst: u32, per_minute: u32) -> AuthFailureGuard {
        AuthFailureGuard::new(GuardSettings::new(burst, per_minute))
    }

    #[test]
    fn failures_block_an_address_at_the_burst_but_not_a_verified_key() {
        let guard = guard(5, 6);
        let client: IpAddr = "203.0.113.7".parse().expect("ip");
        let other: IpAddr = "203.0.113.8".parse().expect("ip");
        let good: PresentedKey = (Uuid::new_v4(), [7; 32]);
        let good_id_wrong_secret = Presented::Key((good.0, [8; 32]));
        let made_up = Presented::Key((Uuid::new_v4(), [9; 32]));
        guard.remember(&good);
        for failure in 0..5 {
            assert_eq!(
                guard.admit(client, &made_up),
                Ok(Admitted::ByTheAnswer),
                "{failure}"
            );
            guard.record(client, 401);
        }
        // Five failures (the burst) and the sixth request is refused.
        assert!(guard.admit(client, &made_up).is_err());
        assert!(guard.admit(client, &Presented::Nothing).is_err());
        assert_eq!(
            guard.admit(client, &Presented::Key(good)),
            Ok(Admitted::ByTheAnswer)
        );
        // The id of a verified key with another secret opens nothing, and
        // the bootstrap key is blocked like a guess.
        assert!(guard.admit(client, &good_id_wrong_secret).is_err());
        assert!(guard.admit(client, &Presented::Bootstrap).is_err());
        assert_eq!(guard.admit(other, &made_up), Ok(Admitted::ByTheAnswer));
        // A request with no key is never counted.
        assert_eq!(
            guard.admit(other, &Presented::Nothing),
            Ok(Admitted::NotCounted)
        );
    }

    #[test]
    fn certain_failures_are_counted_before_the_answer() {
        let guard = guard(3, 1);
        let client: IpAddr = "203.0.113.9".parse().expect("ip");
        // Three concurrent guesses are admitted and counted at once; the
        // fourth is refused before any of them is answered.
        for _ in 0..3 {
            assert_eq!(
                guard.admit(client, &Presented::Refused),
                Ok(Admitted::Counted)
            );
        }
        assert!(guard.admit(client, &Presented::Refused).is_err());
        assert!(guard.admit(client, &Presented::Bootstrap).is_err());
    }

    #[test]
    fn the_memory_knows_a_key_by_its_secret_not_its_id() {
        let guard = guard(0, 0);
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
    fn the_memory_is_refreshed_by_each_proof() {
        let mut settings = GuardSettings::new(0, 0);
        settings.verified_key_memory = Duration::from_millis(300);
        let guard = AuthFailureGuard::new(settings);
        let key: PresentedKey = (Uuid::new_v4(), [1; 32]);
        guard.remember(&key);
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(guard.recognise(&key), Known::Verified);
        }
        // A wrong secret for the id proves nothing and refreshes nothing.
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(guard.recognise(&(key.0, [2; 32])), Known::WrongSecret);
        }
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(guard.recognise(&key), Known::Unknown);
    }

    fn v4(n: u32) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + n))
    }

    /// `times` made-up keys from `client`, each admitted then answered 401.
    fn fail(guard: &AuthFailureGuard, client: IpAddr, times: u32) {
        for _ in 0..times {
            let made_up = Presented::Key((Uuid::new_v4(), [9; 32]));
            if guard.admit(client, &made_up) == Ok(Admitted::ByTheAnswer) {
                guard.record(client, 401);
            }
        }
    }

    #[test]
    fn a_full_table_forgets_no_failure_and_newcomers_share_one_count() {
        let mut settings = GuardSettings::new(3, 1);
        settings.tracked_max = 100;
        let guard = AuthFailureGuard::new(settings);
        let remembered: PresentedKey = (Uuid::new_v4(), [7; 32]);
        guard.remember(&remembered);
        // The first blocked, so the one that has drained the most.
        let first: IpAddr = "198.51.100.1".parse().expect("ip");
        fail(&guard, first, 3);
        for n in 0..99 {
            fail(&guard, v4(n), 3);
        }
        assert_eq!(guard.tracked().0, 100);
        // A thousand new addresses: none gets an entry, none unblocks one.
        for n in 1000..2000 {
            fail(&guard, v4(n), 1);
        }
        assert_eq!(guard.tracked(), (100, 100, 1));
        assert!(guard.admit(first, &Presented::Nothing).is_err());
        // The newcomers' shared count is blocked: a new address is refused,
        // even with a key the database would take, but not with a key this
        // replica remembers.
        let fresh: IpAddr = "192.0.2.200".parse().expect("ip");
        let unknown = Presented::Key((Uuid::new_v4(), [8; 32]));
        assert!(guard.admit(fresh, &unknown).is_err());
        assert_eq!(
            guard.admit(fresh, &Presented::Key(remembered)),
            Ok(Admitted::ByTheAnswer)
        );
    }

    #[test]
    fn a_full_table_makes_room_once_failures_drain() {
        // 600 a minute: one failure drains in 100 ms.
        let mut settings = GuardSettings::new(3, 600);
        settings.tracked_max = 100;
        let guard = AuthFailureGuard::new(settings);
        for n in 0..100 {
            fail(&guard, v4(n), 1);
        }
        let fresh: IpAddr = "192.0.2.201".parse().expect("ip");
        fail(&guard, fresh, 3);
        // Shared with nobody else yet, the overflow blocks at the burst.
        assert!(guard.admit(fresh, &Presented::Nothing).is_err());
        std::thread::sleep(SWEEP_INTERVAL + Duration::from_millis(50));
        // Drained entries are swept out; the next newcomer has its own.
        let next: IpAddr = "192.0.2.202".parse().expect("ip");
        assert!(guard.admit(next, &Presented::Nothing).is_ok());
        guard.record(next, 401);
        assert_eq!(guard.tracked().0, 1);
    }

    #[test]
    fn the_key_memory_has_its_own_bound() {
        let mut settings = GuardSettings::new(3, 1);
        settings.tracked_max = 100;
        settings.verified_keys_max = 150;
        let guard = AuthFailureGuard::new(settings);
        let keys: Vec<PresentedKey> = (0..200).map(|_| (Uuid::new_v4(), [3; 32])).collect();
        for key in &keys {
            guard.remember(key);
        }
        assert_eq!(guard.tracked().2, 150);
        assert_eq!(guard.recognise(&keys[149]), Known::Verified);
        assert_eq!(guard.recognise(&keys[150]), Known::Unknown);
    }

    #[test]
    fn ipv6_is_counted_per_network() {
        let guard = guard(2, 1);
        let one: IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().expect("ip");
        let other_64: IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        guard.record(one, 401);
        guard.record(same_64, 401);
        assert!(guard.admit(one, &Presented::Nothing).is_err());
        assert!(guard.admit(same_64, &Presented::Nothing).is_err());
        assert!(guard.admit(other_64, &Presented::Nothing).is_ok());
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().expect("ip");
        assert_eq!(
            guard.subject(mapped),
            "192.0.2.1".parse::<IpAddr>().expect("ip")
        );
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let mut settings = GuardSettings::new(5, 6);
        settings.trusted_proxies = vec!["10.0.0.0/8".parse().expect("cidr")];
        let guard = AuthFailureGuard::new(settings.clone());
        let proxy: IpAddr = "10.1.2.3".parse().expect("ip");
        let stranger: IpAddr = "198.51.100.1".parse().expect("ip");
        let ip = |text: &str| text.parse::<IpAddr>().expect("ip");
        let client = |peer, lines: &[&str]| {
            let lines: Vec<&[u8]> = lines.iter().map(|line| line.as_bytes()).collect();
            guard.client_address(Some(peer), &lines).expect("ip")
        };
        assert_eq!(client(stranger, &["192.0.2.1"]), stranger);
        assert_eq!(client(proxy, &[]), proxy);
        assert_eq!(client(proxy, &["192.0.2.1"]), ip("192.0.2.1"));
        // A hop the client wrote itself, left of the real one, is ignored.
        assert_eq!(
            client(proxy, &["1.1.1.1, 192.0.2.1, 10.9.9.9"]),
            ip("192.0.2.1")
        );
        assert_eq!(client(proxy, &["garbage"]), proxy);
        // Every line, in order: the last line's hops are the nearest.
        assert_eq!(client(proxy, &["6.6.6.6", "192.0.2.7"]), ip("192.0.2.7"));
        // Hops with ports.
        assert_eq!(client(proxy, &["8.8.4.4:1234"]), ip("8.8.4.4"));
        assert_eq!(client(proxy, &["[2001:db8::5]:443"]), ip("2001:db8::5"));
        assert_eq!(client(proxy, &["[2001:db8::6]"]), ip("2001:db8::6"));

        settings.forwarded_header = ForwardedHeader::Forwarded;
        let guard = AuthFailureGuard::new(settings);
        let client = |peer, lines: &[&str]| {
            let lines: Vec<&[u8]> = lines.iter().map(|line| line.as_bytes()).collect();
            guard.client_address(Some(peer), &lines).expect("ip")
        };
        assert_eq!(
            client(
                proxy,
                &[
                    "for=6.6.6.6",
                    "for=\"[2001:db8::7]:80\";proto=https, for=10.0.0.9"
                ]
            ),
            ip("2001:db8::7")
        );
        // Unquoted with a port is not RFC 7239, but unambiguous.
        assert_eq!(client(proxy, &["for=192.0.2.3:80"]), ip("192.0.2.3"));
        assert_eq!(client(proxy, &["for=\"192.0.2.3:80\""]), ip("192.0.2.3"));
        assert_eq!(client(proxy, &["for=unknown"]), proxy);
    }

    #[test]
    fn a_malformed_hop_is_skipped_and_a_hidden_one_stops_the_walk() {
        let mut settings = GuardSettings::new(5, 6);
        settings.trusted_proxies = vec!["10.0.0.0/8".parse().expect("cidr")];
        let proxy: IpAddr = "10.1.2.3".parse().expect("ip");
        let ip = |text: &str| text.parse::<IpAddr>().expect("ip");
        for (header, cases) in [
            (
                ForwardedHeader::XForwardedFor,
                [
                    // nginx's append form: the client's junk, then the client.
                    (&b"\xff\xfe, 192.0.2.1"[..], "192.0.2.1"),
                    (b"caf\xc3\xa9, \"[::1, 192.0.2.2, 10.0.0.7", "192.0.2.2"),
                    // Junk written right of the client is skipped too.
                    (b"192.0.2.3, \xff, 10.0.0.7, garbage", "192.0.2.3"),
                    // Nothing but junk: the request came from the proxy.
                    (b"\xff", "10.1.2.3"),
                    // A proxy that hides its client stops the walk there.
                    (b"192.0.2.4, unknown, 10.0.0.7", "10.0.0.7"),
                ],
            ),
            (
                ForwardedHeader::Forwarded,
                [
                    (&b"for=\"\xff, for=192.0.2.1"[..], "192.0.2.1"),
                    (
                        b"for=_x;garbage, for=\"[2001:db8::2]:80\";proto=https, for=10.0.0.7",
                        "2001:db8::2",
                    ),
                    (
                        b"for=192.0.2.3, for=\xe2\x80\x8b, for=10.0.0.7",
                        "192.0.2.3",
                    ),
                    (b"for=\"", "10.1.2.3"),
                    (b"for=192.0.2.4, for=_hidden, for=10.0.0.7", "10.0.0.7"),
                ],
            ),
        ] {
            settings.forwarded_header = header;
            let guard = AuthFailureGuard::new(settings.clone());
            for (line, client) in cases {
                assert_eq!(
                    guard.client_address(Some(proxy), &[line]),
                    Some(ip(client)),
                    "{header:?} {}",
                    line.escape_ascii()
                );
            }
        }
    }

    #[test]
    fn buckets() {
        let id: Uuid = "0123456789abcdef0123456789abcdef".parse().expect("uuid");
        assert_eq!(bucket_of(&id), "key:0123456789abcdef0123456789abcdef");
    }
}
