//! Differential test: random histories — credits (with notes) and
//! adjustments (with reasons), their replays and reuses; reserves with
//! refusals, replays and reuses, through every kind of key (admin, the
//! account's kiosk, another account's kiosk, finance, revoked, expired);
//! full and partial commits (also of reservations drawn from several
//! grants) and their retries with other amounts; releases,
//! extends, expiries; suspensions, limit and threshold changes; jobs
//! through the engine's claim, heartbeat, retry and fenced finish (stale
//! tokens included), lapsed leases, attempts running out, finished jobs
//! with a held reservation; reaper passes; bursts of concurrent requests
//! across accounts (cross-account batches) and on one account; and mixed
//! engine batches (reserves, commits, releases and credits of any
//! accounts in one transaction, each seeing the ones before it) — go to
//! the real service and to the plain model (`model.rs`). Every
//! answer (status and code; a worker's fenced outcome; a claim's attempts
//! and flags), every account's balances after every step, and at the end
//! every reservation (with its draws), job (status, error code, attempts),
//! ledger entry (with the grant and the reservation it names), credit
//! grant and event must agree. Credits and positive adjustments come with
//! random priorities (or none) and random expiries (one of `EXPIRY_HOURS`
//! ahead of the history's start, or none), so reserves, commits, returns
//! and removals span grants and the draw order by expiry is exercised.
//! The service's grant ids are mapped to the model's grants by the credit
//! and adjustment answers (`grant_id`).
//!
//! Grant expiry: the `ExpireGrant` step makes one of an account's grants
//! lapse now — in the service its `expires_at` moves to `clock_timestamp()`
//! (every entry written so far stays before it), in the model its expiry
//! passes. The model then writes the lapse where the engine must: on the
//! account's next reserve or job (once its key may spend, whatever the
//! answer), its next removal (whatever the answer), or the next reaper
//! pass; and a settlement's return to that grant expires at once. Compared
//! besides the above: every account's `grant_expired` after every step,
//! each grant's expiry, `expired` tokens and whether its lapse is written
//! (`expired_at`), its status in the grants list, the `grant_expire`
//! entries' reason and actor, and the `grant.expired` and
//! `grant.expiring` events with their grant and amount (the reaper runs
//! with a 72-hour notice window, and two of the three expiries lie within
//! it: the model sends the notices too). A removal sent with an expiry is
//! refused.
//!
//! The engine has one path (`engine_apply`, `src/engine/sql/70_apply.sql`):
//! a single request is a batch of one, and a coalesced batch goes through
//! the same functions, so the service must agree with the model at every
//! step whatever the batching.

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::db::schema::{accounts, generation_jobs, reservations};
use token_billing::domain::job_leases::{
    finish_failure, finish_operation, finish_success, finished, heartbeat, heartbeat_many,
    retry_later, Fenced, JobError,
};
use token_billing::domain::reaper::{run_pass, ReaperSettings};

use crate::helpers::{ledger_of, property_config, TestApp, ADMIN_KEY};
use crate::model::{Caller, Claim, Expiry, Model, Reply};

const ACCOUNTS: usize = 3;
/// Each account's low-balance threshold at creation (0: off).
const THRESHOLDS: [i64; ACCOUNTS] = [0, 3, 20];
/// `JOB_MAX_ATTEMPTS` of the history's worker and reaper: small, so that
/// histories run out of attempts.
const MAX_ATTEMPTS: i32 = 2;
/// The expiries credits and positive adjustments may name: this many hours
/// after the history's start (ascending: the model ranks them so).
const EXPIRY_HOURS: [i64; 3] = [24, 48, 720];
/// An extension's TTL: a day, longer than any reservation's TTL, so it
/// always asks for more than the reservation holds; it reaches past the
/// first of `EXPIRY_HOURS` (24 h after the history's start), which caps
/// it, and not the second (grant expiry dominates extension).
const EXTEND_SECONDS: i32 = 86_400;
/// The reaper's `GRANT_EXPIRING_NOTICE_HOURS`: the first two expiries lie
/// within it.
const NOTICE_HOURS: i32 = 72;

/// The key a request carries, relative to the account it names.
#[derive(Clone, Copy, Debug)]
enum Key {
    Admin,
    OwnKiosk,
    OtherKiosk,
    Finance,
    Revoked,
    Expired,
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        12 => Just(Key::Admin),
        6 => Just(Key::OwnKiosk),
        1 => Just(Key::OtherKiosk),
        1 => Just(Key::Finance),
        1 => Just(Key::Revoked),
        1 => Just(Key::Expired),
    ]
}

#[derive(Clone, Debug)]
enum Step {
    /// `note`: one of two notes or none; `priority`: one of PRIORITIES or
    /// none (the default); `expiry`: one of EXPIRY_HOURS or none (never);
    /// `reuse`: the reference of an earlier credit (a replay, or a reuse
    /// with another body) or, from `REUSE_OTHER_KIND` on, of an earlier
    /// adjustment (always a reuse: one namespace).
    Credit(
        usize,
        i64,
        Option<u8>,
        Option<u8>,
        Option<u8>,
        Option<usize>,
    ),
    /// `reason`: one of two reasons; `priority` and `expiry` as for a
    /// credit (refused on a removal).
    Adjust(usize, i64, u8, Option<u8>, Option<u8>, Option<usize>),
    /// The n-th of the grants whose expiry has not passed (of any account)
    /// — of those that `Pick` says, if there are any — lapses now.
    ExpireGrant(usize, Pick),
    /// `replay`: an earlier request_id of the account, with this amount.
    /// TTLs are long (≥ 10 min) so nothing expires by the clock during a
    /// history: expiry is the explicit `Age` step, which the model sees.
    Reserve(usize, i64, Option<i32>, Option<usize>, Key),
    /// Commit the n-th reservation through account `a` (maybe not its
    /// own), optionally partially.
    Commit(usize, usize, Option<i64>, Key),
    Release(usize, usize, Key),
    /// Commit part (at most this many tokens) of the n-th held reservation
    /// of the API, through its own account: partial commits of
    /// reservations that drew from several grants.
    CommitHeld(usize, i64),
    /// A client's retry of the latest commit or release the API answered:
    /// a commit (all, or this amount) or a release (`None`), through the
    /// account's own kiosk key.
    Again(Option<Option<i64>>),
    Extend(usize, usize),
    /// Extend the n-th held reservation of the API through its own
    /// account: extensions of reservations whose grants expire (or have
    /// lapsed) before the asked instant, which are capped.
    ExtendHeld(usize),
    /// Push the n-th reservation past its expiry.
    Age(usize),
    /// Push the n-th job's reservation past its expiry.
    AgeJob(usize),
    Suspend(usize, bool),
    Limit(usize, i64),
    Threshold(usize, i64),
    /// A job (`replay`: an earlier request of the account; `seed`: params).
    Job(usize, Option<usize>, u64),
    /// A worker claims every due job (`engine_claim_jobs`).
    Claim,
    /// The n-th job's worker heartbeats; `stale`: with the token of the
    /// lease before its latest (a worker that lost it).
    Heartbeat(usize, bool),
    /// The replica's heartbeat ticker: one set-based heartbeat for every
    /// job the history's worker holds a lease token of; the n-th job with
    /// bit n % 8 of the mask set sends the token before its latest (a
    /// worker that lost the lease and does not know it yet).
    HeartbeatAll(u8),
    /// The n-th job's provider attempt fails retryably: back to the queue,
    /// or a final failure on the last attempt.
    Retry(usize, bool),
    /// The n-th job's worker finishes (success or a provider failure).
    Finish(usize, bool, bool),
    /// Several workers' finishes in one engine batch (as the coalescer
    /// joins them): the n-th job, success, stale token. A job comes once
    /// (the first of its finishes is kept).
    FinishMany(Vec<(usize, bool, bool)>),
    /// The n-th job's worker dies: its lease runs out.
    Lapse(usize),
    /// The n-th job is found finished with its reservation still held (an
    /// earlier version's crash between the two writes): the reaper's
    /// fix-up settles it.
    FinishedUnsettled(usize, bool),
    Reaper,
    /// One reserve on each listed account, all at once.
    Burst(Vec<(usize, i64)>),
    /// Several reserves on one account, all at once.
    Crowd(usize, Vec<i64>),
    /// One engine batch of several operations, in order, as the coalescer
    /// sends concurrent requests: each must be answered, and leave the
    /// books, as if it ran alone after the ones before it.
    Mixed(Vec<(Mixed, Key)>),
}

/// An operation of a `Mixed` batch. Settlements name the n-th reservation
/// (of the model's, made before the batch) through its own account.
#[derive(Clone, Copy, Debug)]
enum Mixed {
    Reserve(usize, i64),
    /// Commit all, or at most this many tokens.
    Commit(usize, Option<i64>),
    Release(usize),
    /// A credit (fresh reference) of this many tokens, at one of
    /// PRIORITIES or the default: it writes at once, after the batch's
    /// pending writes.
    Credit(usize, i64, Option<u8>),
}

/// Which grants an `ExpireGrant` step picks from (when none of them is
/// left: from all whose expiry has not passed).
#[derive(Clone, Copy, Debug)]
enum Pick {
    Any,
    /// Those that reservations drew from (`reserved` > 0): their rest
    /// expires when the reservation settles.
    Reserved,
    /// Those holding `remaining` tokens: their lapse takes them.
    Remaining,
}

/// The priorities credits and positive adjustments name.
const PRIORITIES: [i64; 4] = [0, 10, 50, 90];

fn priority() -> impl Strategy<Value = Option<u8>> {
    prop::option::weighted(0.7, 0..PRIORITIES.len() as u8)
}

fn expiry(probability: f64) -> impl Strategy<Value = Option<u8>> {
    prop::option::weighted(probability, 0..EXPIRY_HOURS.len() as u8)
}

fn step() -> impl Strategy<Value = Step> {
    let account = 0..ACCOUNTS;
    let reuse = || prop::option::weighted(0.2, 0..20usize);
    prop_oneof![
        6 => (account.clone(), 1..8i64, prop::option::of(0..2u8), priority(), expiry(0.6),
              reuse())
            .prop_map(|(a, n, note, p, e, r)| Step::Credit(a, n, note, p, e, r)),
        2 => (account.clone(), prop_oneof![-6..0i64, 1..4i64], 0..2u8,
              prop::option::weighted(0.3, 0..PRIORITIES.len() as u8), expiry(0.3), reuse())
            .prop_map(|(a, n, why, p, e, r)| Step::Adjust(a, n, why, p, e, r)),
        4 => (0..20usize,
              prop_oneof![1 => Just(Pick::Any), 3 => Just(Pick::Reserved), 2 => Just(Pick::Remaining)])
            .prop_map(|(n, pick)| Step::ExpireGrant(n, pick)),
        6 => (account.clone(), 1..4i64, prop::option::weighted(0.2, 600..86_400i32),
              reuse(), key())
            .prop_map(|(a, n, t, r, k)| Step::Reserve(a, n, t, r, k)),
        4 => (account.clone(), 0..40usize, prop::option::weighted(0.3, 1..4i64), key())
            .prop_map(|(a, n, m, k)| Step::Commit(a, n, m, k)),
        2 => (account.clone(), 0..40usize, key()).prop_map(|(a, n, k)| Step::Release(a, n, k)),
        2 => (0..40usize, 1..4i64).prop_map(|(n, m)| Step::CommitHeld(n, m)),
        2 => prop::option::weighted(0.8, prop::option::of(1..4i64)).prop_map(Step::Again),
        1 => (account.clone(), 0..40usize).prop_map(|(a, n)| Step::Extend(a, n)),
        2 => (0..40usize).prop_map(Step::ExtendHeld),
        2 => (0..40usize).prop_map(Step::Age),
        2 => (0..20usize).prop_map(Step::AgeJob),
        1 => (account.clone(), any::<bool>()).prop_map(|(a, s)| Step::Suspend(a, s)),
        1 => (account.clone(), 0..4i64).prop_map(|(a, l)| Step::Limit(a, l)),
        1 => (account.clone(), prop_oneof![Just(0i64), 1..25i64])
            .prop_map(|(a, t)| Step::Threshold(a, t)),
        3 => (account.clone(), prop::option::weighted(0.2, 0..10usize), 0..2u64)
            .prop_map(|(a, r, s)| Step::Job(a, r, s)),
        3 => Just(Step::Claim),
        1 => (0..20usize, prop::bool::weighted(0.2)).prop_map(|(n, s)| Step::Heartbeat(n, s)),
        2 => any::<u8>().prop_map(Step::HeartbeatAll),
        2 => (0..20usize, prop::bool::weighted(0.2)).prop_map(|(n, s)| Step::Retry(n, s)),
        3 => (0..20usize, any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(n, ok, s)| Step::Finish(n, ok, s)),
        2 => prop::collection::vec((0..20usize, any::<bool>(), prop::bool::weighted(0.2)), 2..=4)
            .prop_map(Step::FinishMany),
        1 => (0..20usize).prop_map(Step::Lapse),
        1 => (0..20usize, any::<bool>()).prop_map(|(n, ok)| Step::FinishedUnsettled(n, ok)),
        2 => Just(Step::Reaper),
        2 => prop::collection::btree_map(account.clone(), 1..3i64, 2..=ACCOUNTS)
            .prop_map(|m| Step::Burst(m.into_iter().collect())),
        2 => (account.clone(), prop::collection::vec(1..4i64, 2..=4))
            .prop_map(|(a, amounts)| Step::Crowd(a, amounts)),
        3 => prop::collection::vec((mixed(account), prop_oneof![2 => Just(Key::Admin),
                                                                1 => Just(Key::OwnKiosk)]),
                                   2..=5)
            .prop_map(Step::Mixed),
    ]
}

fn mixed(account: std::ops::Range<usize>) -> impl Strategy<Value = Mixed> {
    prop_oneof![
        3 => (account.clone(), 1..4i64).prop_map(|(a, n)| Mixed::Reserve(a, n)),
        2 => (0..40usize, prop::option::weighted(0.3, 1..4i64))
            .prop_map(|(n, m)| Mixed::Commit(n, m)),
        2 => (0..40usize).prop_map(Mixed::Release),
        1 => (account, 1..4i64, priority()).prop_map(|(a, n, p)| Mixed::Credit(a, n, p)),
    ]
}

/// The keys of the history: per account a live kiosk key, one revoked and
/// one expired kiosk key, and a finance key.
struct Keys {
    kiosks: Vec<String>,
    revoked: String,
    expired: String,
    finance: String,
}

/// The worker's side of a job: the token of its latest claim (0: never
/// claimed) and what the engine said of that claim.
#[derive(Clone, Copy, Default)]
struct Lease {
    token: i64,
    over_limit: bool,
    last_attempt: bool,
}

/// The service side of the test: ids the model's indices stand for.
struct Real {
    app: TestApp,
    accounts: Vec<Uuid>,
    keys: Keys,
    reservations: Vec<Uuid>,
    jobs: Vec<(Uuid, Uuid)>,
    leases: Vec<Lease>,
    /// The reservation (account, index) of the latest commit or release.
    resolved: Option<(usize, usize)>,
    credit_refs: Vec<String>,
    adjustment_refs: Vec<String>,
    /// The service's id of each of the model's grants, by index.
    grants: Vec<Uuid>,
    /// The instants of EXPIRY_HOURS for this history.
    expiries: Vec<DateTime<Utc>>,
    requests: Vec<Vec<(u64, i64, Option<i32>)>>,
    job_requests: Vec<Vec<(u64, u64)>>,
    next_request: u64,
}

fn request_uuid(n: u64) -> Uuid {
    Uuid::from_u64_pair(0x0d1f_f000_0000_0000, n)
}

async fn reply(response: reqwest::Response) -> (Reply, Value) {
    let status = response.status().as_u16();
    // An extension capped at its grants' expiry says so in a header: the
    // model's reply names it as a code.
    let capped = response.headers().get("extension-capped").is_some();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let code = body["code"]
        .as_str()
        .map(|code| -> &'static str { Box::leak(code.to_owned().into_boxed_str()) });
    let code = match (status < 300, capped) {
        (true, true) => Some("extension_capped"),
        (true, false) => None,
        (false, _) => code,
    };
    (Reply { status, code }, body)
}

impl Real {
    /// The key to send, and who the model sees calling.
    fn key(&self, key: Key, account: usize) -> (String, Caller) {
        let other = (account + 1) % ACCOUNTS;
        match key {
            Key::Admin => (ADMIN_KEY.to_owned(), Caller::Admin),
            Key::OwnKiosk => (self.keys.kiosks[account].clone(), Caller::Kiosk(account)),
            Key::OtherKiosk => (self.keys.kiosks[other].clone(), Caller::Kiosk(other)),
            Key::Finance => (self.keys.finance.clone(), Caller::Finance),
            Key::Revoked => (self.keys.revoked.clone(), Caller::Revoked),
            Key::Expired => (self.keys.expired.clone(), Caller::Expired),
        }
    }

    async fn reserve_request(
        &self,
        account: usize,
        n: u64,
        amount: i64,
        ttl: Option<i32>,
        key: &str,
    ) -> (Reply, Value) {
        let mut body = json!({"request_id": request_uuid(n), "amount": amount});
        if let Some(ttl) = ttl {
            body["ttl_seconds"] = json!(ttl);
        }
        let path = format!("/v1/accounts/{}/reservations", self.accounts[account]);
        reply(self.app.post(&path, key, &body).await).await
    }

    /// The model's expiry of an expiry rank, and the `expires_at` to send.
    fn expiry(&self, rank: Option<u8>) -> (Expiry, Option<String>) {
        match rank {
            None => (Expiry::Never, None),
            Some(rank) => (
                Expiry::At(rank),
                Some(self.expiries[usize::from(rank)].to_rfc3339_opts(SecondsFormat::Micros, true)),
            ),
        }
    }

    fn job_index(&self, id: Uuid) -> usize {
        self.jobs
            .iter()
            .position(|&(job, _)| job == id)
            .expect("a job of the history")
    }
}

fn remember(list: &mut Vec<Uuid>, index: Option<usize>, id: Option<Uuid>) {
    if let (Some(index), Some(id)) = (index, id) {
        if index == list.len() {
            list.push(id);
        }
    }
}

fn uuid_of(value: &Value) -> Option<Uuid> {
    value.as_str().and_then(|text| text.parse().ok())
}

async fn resolve_request(
    real: &Real,
    account: usize,
    index: usize,
    verb: &str,
    body: &Value,
    key: &str,
) -> Reply {
    let url = format!(
        "/v1/accounts/{}/reservations/{}/{verb}",
        real.accounts[account], real.reservations[index]
    );
    reply(real.app.post(&url, key, body).await).await.0
}

/// Every order of `0..n` (n ≤ 4 here).
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for shorter in orders(n - 1) {
        for at in 0..=shorter.len() {
            let mut order = shorter.clone();
            order.insert(at, n - 1);
            all.push(order);
        }
    }
    all
}

#[derive(QueryableByName)]
struct ClaimRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    lease_token: i64,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    attempts: i32,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    over_limit: bool,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    last_attempt: bool,
}

/// The reference a credit's or adjustment's `reuse` names: `n` of its own
/// kind's earlier references (a replay, or a reuse with another body), or
/// from `REUSE_OTHER_KIND` on, one of the other kind's, whichever there are
/// (credits and adjustments share one namespace: always refused).
fn reused(own: &[String], other: &[String], n: usize) -> Option<String> {
    match n.checked_sub(REUSE_OTHER_KIND) {
        Some(k) => (!other.is_empty()).then(|| other[k % other.len()].clone()),
        None => own.get(n).cloned(),
    }
}

const REUSE_OTHER_KIND: usize = 16;

const NOTES: [&str; 2] = ["event package", "promotion"];
const REASONS: [&str; 2] = ["correction", "goodwill"];

async fn run_step(real: &mut Real, model: &mut Model, step: &Step, conn: &mut PgConnection) {
    let path = |real: &Real, account: usize| format!("/v1/accounts/{}", real.accounts[account]);
    let (expected, actual) = match step.clone() {
        Step::Credit(account, amount, note, priority, expiry, reuse) => {
            let reference = reuse
                .and_then(|n| reused(&real.credit_refs, &real.adjustment_refs, n))
                .unwrap_or_else(|| Uuid::new_v4().to_string());
            real.credit_refs.push(reference.clone());
            let note = note.map(|n| NOTES[usize::from(n)]);
            let priority = priority.map(|p| PRIORITIES[usize::from(p)]);
            let mut body = json!({"amount": amount, "external_ref": reference});
            if let Some(note) = note {
                body["note"] = json!(note);
            }
            if let Some(priority) = priority {
                body["priority"] = json!(priority);
            }
            let (expiry, expires_at) = real.expiry(expiry);
            if let Some(expires_at) = expires_at {
                body["expires_at"] = json!(expires_at);
            }
            let url = format!("{}/credits", path(real, account));
            let (actual, answer) = reply(real.app.post(&url, ADMIN_KEY, &body).await).await;
            let expected = model.credit(account, amount, note, priority, expiry, &reference);
            if expected.status == 201 && actual.status == 201 {
                real.grants
                    .push(uuid_of(&answer["grant_id"]).expect("a credit's grant_id"));
            }
            (expected, actual)
        }
        Step::Adjust(account, amount, reason, priority, expiry, reuse) => {
            let reference = reuse
                .and_then(|n| reused(&real.adjustment_refs, &real.credit_refs, n))
                .unwrap_or_else(|| Uuid::new_v4().to_string());
            real.adjustment_refs.push(reference.clone());
            let reason = REASONS[usize::from(reason)];
            let priority = priority.map(|p| PRIORITIES[usize::from(p)]);
            let mut body = json!({"amount": amount, "reason": reason, "external_ref": reference});
            if let Some(priority) = priority {
                body["priority"] = json!(priority);
            }
            let (expiry, expires_at) = real.expiry(expiry);
            if let Some(expires_at) = expires_at {
                body["expires_at"] = json!(expires_at);
            }
            let url = format!("{}/adjustments", path(real, account));
            let (actual, answer) = reply(real.app.post(&url, ADMIN_KEY, &body).await).await;
            let expected = model.adjust(account, amount, reason, priority, expiry, &reference);
            if expected.status == 201 && actual.status == 201 && amount > 0 {
                real.grants
                    .push(uuid_of(&answer["grant_id"]).expect("a positive adjustment's grant_id"));
            }
            (expected, actual)
        }
        Step::Reserve(account, amount, ttl, replay, key) => {
            let earlier = replay.and_then(|n| {
                let list = &real.requests[account];
                list.get(n % list.len().max(1)).copied()
            });
            let n = match earlier {
                Some((n, _, _)) => n,
                None => {
                    real.next_request += 1;
                    real.next_request
                }
            };
            let (secret, caller) = real.key(key, account);
            let (actual, body) = real.reserve_request(account, n, amount, ttl, &secret).await;
            let (expected, index) = model.reserve(caller, account, n, amount, ttl);
            if expected.status == 201 {
                real.requests[account].push((n, amount, ttl));
            }
            remember(
                &mut real.reservations,
                index,
                uuid_of(&body["reservation_id"]),
            );
            (expected, actual)
        }
        Step::Commit(account, n, amount, key) if !model.reservations.is_empty() => {
            let index = n % model.reservations.len();
            let body = amount.map_or(json!({}), |amount| json!({"amount": amount}));
            let (secret, caller) = real.key(key, account);
            let actual = resolve_request(real, account, index, "commit", &body, &secret).await;
            if actual.status == 200 {
                real.resolved = Some((account, index));
            }
            (model.resolve(caller, account, index, Some(amount)), actual)
        }
        Step::CommitHeld(n, part) => {
            let held: Vec<usize> = (0..model.reservations.len())
                .filter(|&i| {
                    let r = &model.reservations[i];
                    r.state == crate::model::State::Held && r.job.is_none()
                })
                .collect();
            let Some(&index) = held.get(n % held.len().max(1)) else {
                return;
            };
            let account = model.reservations[index].account;
            let amount = part.min(model.reservations[index].amount);
            let body = json!({"amount": amount});
            let actual = resolve_request(real, account, index, "commit", &body, ADMIN_KEY).await;
            if actual.status == 200 {
                real.resolved = Some((account, index));
            }
            (
                model.resolve(Caller::Admin, account, index, Some(Some(amount))),
                actual,
            )
        }
        Step::Release(account, n, key) if !model.reservations.is_empty() => {
            let index = n % model.reservations.len();
            let (secret, caller) = real.key(key, account);
            let actual =
                resolve_request(real, account, index, "release", &json!({}), &secret).await;
            if actual.status == 200 {
                real.resolved = Some((account, index));
            }
            (model.resolve(caller, account, index, None), actual)
        }
        Step::Again(action) if real.resolved.is_some() => {
            let (account, index) = real.resolved.expect("a resolution");
            let (secret, caller) = real.key(Key::OwnKiosk, account);
            let actual = match action {
                Some(amount) => {
                    let body = amount.map_or(json!({}), |amount| json!({"amount": amount}));
                    resolve_request(real, account, index, "commit", &body, &secret).await
                }
                None => resolve_request(real, account, index, "release", &json!({}), &secret).await,
            };
            (model.resolve(caller, account, index, action), actual)
        }
        Step::Extend(account, n) if !model.reservations.is_empty() => {
            let index = n % model.reservations.len();
            // A day: past every reservation's own expiry (TTLs < a day), so
            // the extension always asks for more than the reservation has;
            // past the first expiry (24 h), short of the second (48 h).
            let body = json!({"ttl_seconds": EXTEND_SECONDS});
            let actual = resolve_request(real, account, index, "extend", &body, ADMIN_KEY).await;
            (
                model.extend(Caller::Admin, account, index, Expiry::At(1)),
                actual,
            )
        }
        Step::ExtendHeld(n) => {
            let held: Vec<usize> = (0..model.reservations.len())
                .filter(|&i| {
                    let r = &model.reservations[i];
                    r.state == crate::model::State::Held && r.job.is_none()
                })
                .collect();
            let Some(&index) = held.get(n % held.len().max(1)) else {
                return;
            };
            let account = model.reservations[index].account;
            let step = Step::Extend(account, index);
            return Box::pin(run_step(real, model, &step, conn)).await;
        }
        Step::AgeJob(n) if !model.jobs.is_empty() => {
            let reservation = model.jobs[n % model.jobs.len()].reservation;
            let step = Step::Age(reservation);
            return Box::pin(run_step(real, model, &step, conn)).await;
        }
        Step::Age(n) if !model.reservations.is_empty() => {
            let index = n % model.reservations.len();
            diesel::sql_query("UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1 AND state = 'held'")
                .bind::<SqlUuid, _>(real.reservations[index])
                .execute(conn)
                .expect("age");
            if model.reservations[index].state == crate::model::State::Held {
                model.reservations[index].past_expiry = true;
            }
            return;
        }
        Step::ExpireGrant(n, pick) => {
            let due: Vec<usize> = (0..model.grants.len())
                .filter(|&g| model.grants[g].expiry != Expiry::Passed)
                .collect();
            let picked: Vec<usize> = due
                .iter()
                .copied()
                .filter(|&g| match pick {
                    Pick::Any => true,
                    Pick::Reserved => model.grants[g].reserved > 0,
                    Pick::Remaining => model.grants[g].remaining > 0,
                })
                .collect();
            let due = if picked.is_empty() { due } else { picked };
            let Some(&grant) = due.get(n % due.len().max(1)) else {
                return;
            };
            // As waiting for the expiry would: every entry so far lies
            // before it.
            diesel::sql_query(
                "UPDATE credit_grants SET expires_at = clock_timestamp() WHERE id = $1",
            )
            .bind::<SqlUuid, _>(real.grants[grant])
            .execute(conn)
            .expect("lapse a grant");
            model.pass_expiry(grant);
            return;
        }
        Step::Suspend(account, suspended) => {
            let status = if suspended { "suspended" } else { "active" };
            let body = json!({"status": status});
            let response = real.app.patch(&path(real, account), ADMIN_KEY, &body).await;
            (
                model.set_status(account, suspended),
                reply(response).await.0,
            )
        }
        Step::Limit(account, limit) => {
            let body = json!({"max_active_reservations": limit});
            let response = real.app.patch(&path(real, account), ADMIN_KEY, &body).await;
            (model.set_limit(account, limit), reply(response).await.0)
        }
        Step::Threshold(account, threshold) => {
            let body = json!({"low_balance_threshold": threshold});
            let response = real.app.patch(&path(real, account), ADMIN_KEY, &body).await;
            (
                model.set_threshold(account, threshold),
                reply(response).await.0,
            )
        }
        Step::Job(account, replay, seed) => {
            let earlier = replay.and_then(|n| {
                let list = &real.job_requests[account];
                list.get(n % list.len().max(1)).copied()
            });
            let n = match earlier {
                Some((n, _)) => n,
                None => {
                    real.next_request += 1;
                    real.next_request
                }
            };
            let body = json!({"request_id": request_uuid(n), "kind": "standard", "params": {"seed": seed}});
            let (actual, body) = reply(
                real.app
                    .post(&format!("{}/jobs", path(real, account)), ADMIN_KEY, &body)
                    .await,
            )
            .await;
            let (expected, _) = model.create_job(account, n, seed, 1);
            if expected.status == 201 {
                real.job_requests[account].push((n, seed));
                real.reservations
                    .push(uuid_of(&body["reservation"]["reservation_id"]).expect("reservation id"));
                real.jobs
                    .push((uuid_of(&body["job_id"]).expect("job id"), request_uuid(n)));
                real.leases.push(Lease::default());
            }
            (expected, actual)
        }
        Step::Claim => {
            let rows: Vec<ClaimRow> = diesel::sql_query(
                "SELECT (c.job).id, (c.job).lease_token, (c.job).attempts, c.over_limit, \
                 c.last_attempt FROM engine_claim_jobs('differential', 30, $1, 1000) c",
            )
            .bind::<diesel::sql_types::Integer, _>(MAX_ATTEMPTS)
            .load(conn)
            .expect("claim");
            let mut actual: Vec<Claim> = rows
                .iter()
                .map(|row| Claim {
                    job: real.job_index(row.id),
                    token: row.lease_token,
                    attempts: row.attempts,
                    over_limit: row.over_limit,
                    last_attempt: row.last_attempt,
                })
                .collect();
            actual.sort_by_key(|claim| claim.job);
            for claim in &actual {
                real.leases[claim.job] = Lease {
                    token: claim.token,
                    over_limit: claim.over_limit,
                    last_attempt: claim.last_attempt,
                };
            }
            assert_eq!(actual, model.claim_due(MAX_ATTEMPTS), "claims");
            return;
        }
        Step::Heartbeat(n, stale) | Step::Retry(n, stale) if !model.jobs.is_empty() => {
            let index = n % model.jobs.len();
            let lease = real.leases[index];
            let token = lease.token - i64::from(stale);
            let job_id = real.jobs[index].0;
            let retry = matches!(step, Step::Retry(..));
            let error = JobError::new("provider_unavailable", "503");
            let (actual, expected) = if retry && lease.last_attempt {
                // The worker's rule: a retryable failure on the last
                // attempt is final.
                let job = job_row(conn, job_id);
                let actual = finish_failure(conn, &job, token, &error).expect("finish");
                (actual.fenced, model.finish(index, token, Some(error.code)))
            } else if retry {
                let job = job_row(conn, job_id);
                let actual = retry_later(conn, &job, token, &error, 0, 300).expect("retry");
                (actual, model.heartbeat(index, token, true))
            } else {
                let actual = heartbeat(conn, job_id, token, 30, 300).expect("heartbeat");
                (actual, model.heartbeat(index, token, false))
            };
            assert_eq!(fenced(actual), expected, "{step:?}");
            return;
        }
        Step::HeartbeatAll(stale) => {
            let held: Vec<(usize, i64)> = real
                .leases
                .iter()
                .enumerate()
                .filter(|(_, lease)| lease.token > 0)
                .map(|(index, lease)| {
                    let older = stale & (1 << (index % 8)) != 0;
                    (index, lease.token - i64::from(older))
                })
                .collect();
            let ids: Vec<(Uuid, i64)> = held
                .iter()
                .map(|&(index, token)| (real.jobs[index].0, token))
                .collect();
            let mut actual: Vec<(usize, &'static str)> = heartbeat_many(conn, &ids, 30, 300)
                .expect("heartbeat")
                .into_iter()
                .map(|(id, _, outcome)| (real.job_index(id), fenced(outcome)))
                .collect();
            actual.sort_unstable();
            // The engine takes them in job order (creation order here).
            let expected: Vec<(usize, &'static str)> = held
                .iter()
                .map(|&(index, token)| (index, model.heartbeat(index, token, false)))
                .collect();
            assert_eq!(actual, expected, "{step:?}");
            return;
        }
        Step::Finish(n, success, stale) if !model.jobs.is_empty() => {
            let index = n % model.jobs.len();
            let lease = real.leases[index];
            let token = lease.token - i64::from(stale);
            let job = job_row(conn, real.jobs[index].0);
            let error = worker_error(lease.over_limit, success);
            let actual = match &error {
                None => finish_success(conn, &job, token, &json!({"output": "x"})),
                Some(error) => finish_failure(conn, &job, token, error),
            }
            .expect("finish");
            let expected = model.finish(index, token, error.as_ref().map(|e| e.code));
            assert_eq!(fenced(actual.fenced), expected, "{step:?}");
            return;
        }
        Step::FinishMany(finishes) if !model.jobs.is_empty() => {
            let mut operations = Vec::new();
            let mut expected = Vec::new();
            let mut seen = Vec::new();
            for &(n, success, stale) in &finishes {
                let index = n % model.jobs.len();
                if seen.contains(&index) {
                    continue;
                }
                seen.push(index);
                let lease = real.leases[index];
                let token = lease.token - i64::from(stale);
                let job = job_row(conn, real.jobs[index].0);
                let error = worker_error(lease.over_limit, success);
                let result = json!({"output": "x"});
                let outcome = match &error {
                    None => Ok(&result),
                    Some(error) => Err(error),
                };
                operations.push(finish_operation(&job, token, outcome));
                expected.push(model.finish(index, token, error.as_ref().map(|e| e.code)));
            }
            let actual: Vec<&'static str> = token_billing::engine::apply(conn, &operations)
                .expect("batch of finishes")
                .into_iter()
                .map(|answer| fenced(finished(answer).expect("finish").fenced))
                .collect();
            assert_eq!(actual, expected, "{step:?}");
            return;
        }
        Step::Lapse(n) if !model.jobs.is_empty() => {
            let index = n % model.jobs.len();
            diesel::sql_query(
                "UPDATE generation_jobs SET lease_expires_at = now() - interval '1 second' \
                 WHERE id = $1 AND status = 'running'",
            )
            .bind::<SqlUuid, _>(real.jobs[index].0)
            .execute(conn)
            .expect("lapse");
            model.lapse_lease(index);
            return;
        }
        Step::FinishedUnsettled(n, succeeded) if !model.jobs.is_empty() => {
            let index = n % model.jobs.len();
            if model.finish_without_settling(index, succeeded) {
                let (status, error) = if succeeded {
                    ("succeeded", Value::Null)
                } else {
                    (
                        "failed",
                        json!({"code": "provider_failed", "message": "no"}),
                    )
                };
                diesel::sql_query(
                    "UPDATE generation_jobs SET status = $2, error = $3, lease_expires_at = NULL, \
                     finished_at = now() WHERE id = $1",
                )
                .bind::<SqlUuid, _>(real.jobs[index].0)
                .bind::<diesel::sql_types::Text, _>(status)
                .bind::<diesel::sql_types::Nullable<diesel::sql_types::Jsonb>, _>(
                    Some(error).filter(|error| !error.is_null()),
                )
                .execute(conn)
                .expect("finished unsettled");
                // The version that crashed had sent the job's event.
                diesel::sql_query("SELECT engine_job_finished_events(ARRAY[$1])")
                    .bind::<SqlUuid, _>(real.jobs[index].0)
                    .execute(conn)
                    .expect("job event");
            }
            return;
        }
        Step::Reaper => {
            let mut order: Vec<usize> = (0..model.reservations.len()).collect();
            order.sort_by_key(|&i| {
                (
                    real.accounts[model.reservations[i].account],
                    real.reservations[i],
                )
            });
            let mut grant_order: Vec<usize> = (0..model.grants.len()).collect();
            grant_order.sort_by_key(|&g| real.grants[g]);
            let soon: Vec<bool> = EXPIRY_HOURS
                .iter()
                .map(|&hours| hours <= i64::from(NOTICE_HOURS))
                .collect();
            run_pass(
                conn,
                &ReaperSettings {
                    batch: 500,
                    job_max_attempts: MAX_ATTEMPTS,
                    grant_expiring_notice_hours: NOTICE_HOURS,
                },
                None,
            )
            .expect("reaper");
            model.reaper_pass(&order, &grant_order, &soon, MAX_ATTEMPTS);
            return;
        }
        Step::Burst(ops) => {
            let mut requests = Vec::new();
            for (account, amount) in &ops {
                real.next_request += 1;
                requests.push((*account, real.next_request, *amount));
            }
            let answers = concurrently(real, &requests).await;
            for ((account, n, amount), (actual, body)) in requests.into_iter().zip(answers) {
                let (expected, index) = model.reserve(Caller::Admin, account, n, amount, None);
                if expected.status == 201 {
                    real.requests[account].push((n, amount, None));
                }
                remember(
                    &mut real.reservations,
                    index,
                    uuid_of(&body["reservation_id"]),
                );
                assert_eq!(actual, expected, "burst reserve on account {account}");
            }
            return;
        }
        Step::Mixed(ops) => {
            run_mixed(real, model, &ops, conn);
            return;
        }
        Step::Crowd(account, amounts) => {
            let mut requests = Vec::new();
            for amount in &amounts {
                real.next_request += 1;
                requests.push((account, real.next_request, *amount));
            }
            let answers = concurrently(real, &requests).await;
            let actual: Vec<Reply> = answers.iter().map(|(reply, _)| reply.clone()).collect();
            let ledger: Vec<(String, i64, i64, i64, i64)> = ledger_of(conn, real.accounts[account]);
            let named: Vec<Option<Uuid>> = entry_reservations(conn, real.accounts[account]);
            // The service took them in some order: the model, taking them
            // in that order, must give the same answers and the same
            // ledger.
            let explained = orders(requests.len()).into_iter().find_map(|order| {
                let mut candidate = model.clone();
                let mut outcomes = vec![None; requests.len()];
                for &i in &order {
                    let (_, n, amount) = requests[i];
                    outcomes[i] = Some(candidate.reserve(Caller::Admin, account, n, amount, None));
                }
                let replies: Vec<Reply> = outcomes
                    .iter()
                    .map(|outcome| outcome.as_ref().expect("answered").0.clone())
                    .collect();
                let same_ledger = candidate.ledger[account]
                    .iter()
                    .map(|&(kind, amount, a, r, u)| (kind.to_owned(), amount, a, r, u))
                    .eq(ledger.iter().cloned());
                // Two reserves of the same amount leave the same ledger
                // either way; the grants they drew from tell the order.
                let same_draws =
                    outcomes
                        .iter()
                        .zip(&answers)
                        .all(|(outcome, (_, body))| match outcome {
                            Some((reply, Some(index))) if reply.status == 201 => {
                                body["draws"].is_array()
                                    && answer_draws(real, &body["draws"])
                                        == model_draws(&candidate.reservations[*index].draws)
                            }
                            _ => true,
                        });
                // Two reserves of the same amount from the same grants
                // leave the same ledger either way; the reservations the
                // entries name tell the order.
                let id_of = |index: usize| {
                    real.reservations.get(index).copied().or_else(|| {
                        outcomes
                            .iter()
                            .zip(&answers)
                            .find_map(|(outcome, (_, body))| match outcome {
                                Some((_, Some(made))) if *made == index => {
                                    uuid_of(&body["reservation_id"])
                                }
                                _ => None,
                            })
                    })
                };
                let same_reservations = candidate.entry_reservations[account]
                    .iter()
                    .map(|named| named.and_then(id_of))
                    .eq(named.iter().copied());
                (replies == actual && same_ledger && same_draws && same_reservations)
                    .then_some((candidate, order, outcomes))
            });
            let (candidate, order, outcomes) = explained.unwrap_or_else(|| {
                panic!("no order of {requests:?} explains the answers {actual:?} and ledger {ledger:?}")
            });
            *model = candidate;
            for i in order {
                let (_, n, amount) = requests[i];
                let (expected, index) = outcomes[i].clone().expect("answered");
                if expected.status == 201 {
                    real.requests[account].push((n, amount, None));
                }
                remember(
                    &mut real.reservations,
                    index,
                    uuid_of(&answers[i].1["reservation_id"]),
                );
            }
            return;
        }
        _ => return,
    };
    assert_eq!(actual, expected, "{step:?}");
}

/// The reservation each of the account's ledger entries names, in order.
fn entry_reservations(conn: &mut PgConnection, account: Uuid) -> Vec<Option<Uuid>> {
    use token_billing::db::schema::ledger_entries;
    ledger_entries::table
        .filter(ledger_entries::account_id.eq(account))
        .order(ledger_entries::id.asc())
        .select(ledger_entries::reservation_id)
        .load(conn)
        .expect("entries' reservations")
}

/// Reserves `(account, request, amount)` with the admin key, all at once.
/// A `Mixed` batch: one call of the engine (`engine::apply`, one
/// transaction), each operation as the API's route builds it for the key
/// presented; then the model takes them one after another, in order, and
/// every answer must be the model's. (The balances after the batch, and at
/// the end every reservation's draws and every ledger entry, are compared
/// as after any step.)
fn run_mixed(real: &mut Real, model: &mut Model, ops: &[(Mixed, Key)], conn: &mut PgConnection) {
    use actix_web::ResponseError;
    use token_billing::domain::api_keys::{Credentials, BOOTSTRAP_ACTOR};
    use token_billing::engine::types::{
        AccountId, ExternalRef, Priority, RequestId, ReservationId, Tokens,
    };
    use token_billing::engine::{Authority, CommitAmount, Op, Operation, Outcome};
    let ttl = real.app.state.config.reservation_ttl_seconds;
    // Each operation sent, with what the model is asked: the operation,
    // its account, the caller, and the request's number (a reserve), the
    // reservation's index (a settlement) or the reference (a credit).
    let mut operations = Vec::new();
    let mut planned: Vec<(Mixed, usize, Caller, u64, String)> = Vec::new();
    for &(mixed, key) in ops {
        let (account, op, n, reference) = match mixed {
            Mixed::Reserve(account, amount) => {
                real.next_request += 1;
                let op = Op::Reserve {
                    request_id: RequestId(request_uuid(real.next_request)),
                    amount: Tokens::parse(amount).expect("tokens"),
                    ttl_seconds: None,
                    effective_ttl_seconds: ttl,
                };
                (account, op, real.next_request, String::new())
            }
            Mixed::Commit(n, _) | Mixed::Release(n) => {
                if model.reservations.is_empty() {
                    continue;
                }
                let index = n % model.reservations.len();
                let reservation = ReservationId(real.reservations[index]);
                let op = match mixed {
                    Mixed::Commit(_, amount) => Op::Commit {
                        reservation,
                        amount: amount.map_or(CommitAmount::All, |amount| {
                            CommitAmount::Exactly(Tokens::parse(amount).expect("tokens"))
                        }),
                    },
                    _ => Op::Release { reservation },
                };
                let account = model.reservations[index].account;
                (account, op, index as u64, String::new())
            }
            Mixed::Credit(account, amount, priority) => {
                let reference = Uuid::new_v4().to_string();
                let op = Op::Credit {
                    amount: Tokens::parse(amount).expect("tokens"),
                    external_ref: ExternalRef::try_from(reference.clone()).expect("a reference"),
                    note: None,
                    priority: priority.map_or_else(Priority::default, |p| {
                        Priority::try_from(PRIORITIES[usize::from(p)]).expect("a priority")
                    }),
                    expires_at: None,
                    price: None,
                };
                (account, op, 0, reference)
            }
        };
        let (secret, caller) = real.key(key, account);
        // As the routes build them: a credit is an admin's request, and
        // the bootstrap key is the service's own (the route compares it
        // with ADMIN_API_KEY); a kiosk's key is the engine's to verify.
        let authority = match (mixed, key) {
            (Mixed::Credit(..), _) => Authority::Request {
                actor: BOOTSTRAP_ACTOR.to_owned(),
                request_id: None,
                key: None,
            },
            (_, Key::Admin) => Authority::from(Credentials::Bootstrap),
            _ => Authority::from(Credentials::parse(&secret).expect("a key the API accepts")),
        };
        operations.push(Operation {
            account: AccountId(real.accounts[account]),
            authority,
            op,
        });
        let caller = if matches!(mixed, Mixed::Credit(..)) {
            Caller::Admin
        } else {
            caller
        };
        planned.push((mixed, account, caller, n, reference));
    }
    let answers = token_billing::engine::apply(conn, &operations).expect("a mixed batch");
    assert_eq!(answers.len(), planned.len());
    for ((operation, answer), (mixed, account, caller, n, reference)) in
        operations.iter().zip(&answers).zip(planned)
    {
        let actual = match answer.error(operation) {
            Some(error) => Reply {
                status: error.status_code().as_u16(),
                code: Some(error.code()),
            },
            None if answer.outcome == Outcome::Created => Reply {
                status: 201,
                code: None,
            },
            None => Reply {
                status: 200,
                code: None,
            },
        };
        let object = answer.object.clone().unwrap_or(Value::Null);
        let expected = match mixed {
            Mixed::Reserve(_, amount) => {
                let (expected, index) = model.reserve(caller, account, n, amount, None);
                if expected.status == 201 {
                    real.requests[account].push((n, amount, None));
                }
                remember(&mut real.reservations, index, uuid_of(&object["id"]));
                expected
            }
            Mixed::Commit(_, amount) => model.resolve(caller, account, n as usize, Some(amount)),
            Mixed::Release(_) => model.resolve(caller, account, n as usize, None),
            Mixed::Credit(_, amount, priority) => {
                let priority = priority.map(|p| PRIORITIES[usize::from(p)]);
                real.credit_refs.push(reference.clone());
                let expected =
                    model.credit(account, amount, None, priority, Expiry::Never, &reference);
                if expected.status == 201 && actual.status == 201 {
                    real.grants
                        .push(uuid_of(&object["credit"]["grant_id"]).expect("a credit's grant_id"));
                }
                expected
            }
        };
        assert_eq!(actual, expected, "{mixed:?} in the batch {ops:?}");
    }
}

async fn concurrently(real: &Real, requests: &[(usize, u64, i64)]) -> Vec<(Reply, Value)> {
    let app = &real.app;
    let futures = requests.iter().map(|&(account, n, amount)| {
        let path = format!("/v1/accounts/{}/reservations", real.accounts[account]);
        async move {
            reply(
                app.post(
                    &path,
                    ADMIN_KEY,
                    &json!({"request_id": request_uuid(n), "amount": amount}),
                )
                .await,
            )
            .await
        }
    });
    futures_util::future::join_all(futures).await
}

fn job_row(conn: &mut PgConnection, id: Uuid) -> token_billing::db::models::JobRow {
    generation_jobs::table
        .find(id)
        .first(conn)
        .expect("job row")
}

/// How the worker ends a job it holds: a job claimed with no attempt left
/// fails (no provider result to take in this test); else the provider's
/// success, or its failure.
fn worker_error(over_limit: bool, success: bool) -> Option<JobError> {
    if over_limit {
        Some(JobError::new("attempts_exhausted", "too many attempts"))
    } else if success {
        None
    } else {
        Some(JobError::new("provider_failed", "no"))
    }
}

fn fenced(outcome: Fenced) -> &'static str {
    match outcome {
        Fenced::Done => "done",
        Fenced::LeaseLost => "lease_lost",
        Fenced::ReservationLost => "reservation_lost",
    }
}

fn compare_balances(model: &Model, real: &Real, conn: &mut PgConnection, step: &Step) {
    for (index, expected) in model.accounts.iter().enumerate() {
        let row: (String, i64, i64, i64, i64, i64, i64, i32, i32) = accounts::table
            .find(real.accounts[index])
            .select((
                accounts::status,
                accounts::available,
                accounts::reserved,
                accounts::used,
                accounts::credited,
                accounts::adjusted,
                accounts::grant_expired,
                accounts::active_reservations,
                accounts::max_active_reservations,
            ))
            .first(conn)
            .expect("account");
        let status = if expected.suspended {
            "suspended"
        } else {
            "active"
        };
        assert_eq!(
            row,
            (
                status.to_owned(),
                expected.available,
                expected.reserved,
                expected.used,
                expected.credited,
                expected.adjusted,
                expected.grant_expired,
                i32::try_from(expected.active).expect("count"),
                i32::try_from(expected.limit).expect("limit"),
            ),
            "account {index} after {step:?}"
        );
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    count: i64,
}

fn compare_final(model: &Model, real: &Real, conn: &mut PgConnection) {
    for (index, expected) in model.reservations.iter().enumerate() {
        let (state, committed): (String, i64) = reservations::table
            .find(real.reservations[index])
            .select((reservations::state, reservations::committed_amount))
            .first(conn)
            .expect("reservation");
        assert_eq!(
            (state.as_str(), committed),
            (expected.state.as_str(), expected.committed),
            "reservation {index}"
        );
    }
    for (index, expected) in model.jobs.iter().enumerate() {
        let (status, error, attempts): (String, Option<Value>, i32) = generation_jobs::table
            .find(real.jobs[index].0)
            .select((
                generation_jobs::status,
                generation_jobs::error,
                generation_jobs::attempts,
            ))
            .first(conn)
            .expect("job");
        let code = error.as_ref().and_then(|error| error["code"].as_str());
        // A requeued job keeps its last error; only a failed job's counts.
        let code = if status == "failed" { code } else { None };
        let expected_code = if expected.status == crate::model::JobStatus::Failed {
            expected.error
        } else {
            None
        };
        assert_eq!(
            (status.as_str(), code, attempts),
            (expected.status.as_str(), expected_code, expected.attempts),
            "job {index}"
        );
    }
    // One movement, one timestamp: a finished job's finished_at is the
    // created_at of the ledger entries its finish wrote (a fix-up settles
    // a finish of earlier).
    let mismatched: i64 = diesel::sql_query(
        "SELECT count(*) AS count FROM generation_jobs j JOIN ledger_entries e \
         ON e.job_id = j.id AND e.kind IN ('commit', 'release') \
         AND e.reason IS DISTINCT FROM 'fixup' \
         WHERE j.finished_at IS DISTINCT FROM e.created_at",
    )
    .get_result::<Count>(conn)
    .expect("timestamps")
    .count;
    assert_eq!(
        mismatched, 0,
        "job finishes stamped apart from their entries"
    );
    for (index, expected) in model.ledger.iter().enumerate() {
        let entries = ledger_of(conn, real.accounts[index]);
        let expected: Vec<(String, i64, i64, i64, i64)> = expected
            .iter()
            .map(|&(kind, amount, a, r, u)| (kind.to_owned(), amount, a, r, u))
            .collect();
        assert_eq!(entries, expected, "ledger of account {index}");
    }
    compare_grants(model, real, conn);
    compare_events(model, real, conn);
}

/// The service's grant as the model's grant index (None: no grant, or one
/// the model does not know).
fn model_grant(real: &Real, id: Option<Uuid>) -> Option<usize> {
    id.and_then(|id| real.grants.iter().position(|&grant| grant == id))
}

/// A reservation's draws as the service wrote them, in the model's grants.
fn answer_draws(real: &Real, draws: &Value) -> Vec<(Option<usize>, i64)> {
    draws
        .as_array()
        .expect("draws are an array")
        .iter()
        .map(|draw| {
            (
                model_grant(real, uuid_of(&draw["grant_id"])),
                draw["amount"].as_i64().expect("a draw's amount"),
            )
        })
        .collect()
}

fn model_draws(draws: &[(usize, i64)]) -> Vec<(Option<usize>, i64)> {
    draws
        .iter()
        .map(|&(grant, amount)| (Some(grant), amount))
        .collect()
}

/// A grant's row: account, priority, remaining, reserved, expired,
/// expires_at, expired_at.
type GrantRow = (
    Uuid,
    i16,
    i64,
    i64,
    i64,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

/// Every grant's books, the grant each ledger entry names, every
/// reservation's draws (in draw order), and the invariant checks.
fn compare_grants(model: &Model, real: &Real, conn: &mut PgConnection) {
    use token_billing::db::schema::credit_grants;
    #[derive(QueryableByName)]
    struct Named {
        #[diesel(sql_type = diesel::sql_types::Nullable<SqlUuid>)]
        grant_id: Option<Uuid>,
        #[diesel(sql_type = diesel::sql_types::Nullable<SqlUuid>)]
        reservation_id: Option<Uuid>,
    }
    for (index, expected) in model.grants.iter().enumerate() {
        let (account, priority, remaining, reserved, expired, expires_at, expired_at): GrantRow =
            credit_grants::table
                .find(real.grants[index])
                .select((
                    credit_grants::account_id,
                    credit_grants::priority,
                    credit_grants::remaining,
                    credit_grants::reserved,
                    credit_grants::expired,
                    credit_grants::expires_at,
                    credit_grants::expired_at,
                ))
                .first(conn)
                .expect("grant");
        assert_eq!(
            (
                account,
                i64::from(priority),
                remaining,
                reserved,
                expired,
                expired_at.is_some()
            ),
            (
                real.accounts[expected.account],
                expected.priority,
                expected.remaining,
                expected.reserved,
                expected.expired,
                expected.lapse_written
            ),
            "grant {index}"
        );
        // The expiry it was made with, or (moved by the test) one passed.
        let expiry_agrees = match expected.expiry {
            Expiry::Never => expires_at.is_none(),
            Expiry::At(rank) => expires_at == Some(real.expiries[usize::from(rank)]),
            Expiry::Passed => expires_at.is_some_and(|at| at <= Utc::now()),
        };
        assert!(
            expiry_agrees,
            "grant {index}: expires_at {expires_at:?}, the model's {:?}",
            expected.expiry
        );
    }
    for (index, expected) in model.entry_grants.iter().enumerate() {
        let named: Vec<Named> = diesel::sql_query(
            "SELECT grant_id, reservation_id FROM ledger_entries WHERE account_id = $1 ORDER BY id",
        )
        .bind::<SqlUuid, _>(real.accounts[index])
        .load::<Named>(conn)
        .expect("entries' grants");
        let grants: Vec<Option<usize>> = named
            .iter()
            .map(|entry| model_grant(real, entry.grant_id))
            .collect();
        assert_eq!(
            grants, *expected,
            "the grants the entries of account {index} name"
        );
        let reservations: Vec<Option<usize>> = named
            .iter()
            .map(|entry| {
                entry.reservation_id.map(|id| {
                    real.reservations
                        .iter()
                        .position(|&known| known == id)
                        .expect("a reservation of the history")
                })
            })
            .collect();
        assert_eq!(
            reservations, model.entry_reservations[index],
            "the reservations the entries of account {index} name"
        );
    }
    // A grant's lapse is the system's; every grant_expire says why.
    let odd: i64 = diesel::sql_query(
        "SELECT count(*) AS count FROM ledger_entries WHERE kind = 'grant_expire' \
         AND (reason IS DISTINCT FROM 'grant_expired' \
              OR (reservation_id IS NULL AND actor <> 'system'))",
    )
    .get_result::<Count>(conn)
    .expect("grant_expire entries")
    .count;
    assert_eq!(odd, 0, "grant_expire entries with another reason or actor");
    for (index, expected) in model.reservations.iter().enumerate() {
        let draws: Value = reservations::table
            .find(real.reservations[index])
            .select(reservations::draws)
            .first(conn)
            .expect("reservation draws");
        assert_eq!(
            answer_draws(real, &draws),
            model_draws(&expected.draws),
            "draws of reservation {index}"
        );
    }
    let violations = token_billing::domain::checks::find_violations(conn).expect("checks");
    assert!(violations.is_empty(), "{violations:#?}");
    let grants =
        token_billing::domain::checks::grants_disagreeing_with_ledger(conn).expect("grant check");
    assert!(grants.is_empty(), "{grants:#?}");
}

/// An event: its type, and for a grant's event its grant (the model's)
/// and amount.
type ShownEvent = (String, Option<(Option<usize>, Option<i64>)>);

/// Each account's events (the model's, in the order it raised them)
/// against the service's in feed order — a grant's event with its grant
/// and amount; and every event against the books.
fn compare_events(model: &Model, real: &Real, conn: &mut PgConnection) {
    #[derive(QueryableByName)]
    struct Event {
        #[diesel(sql_type = diesel::sql_types::Text)]
        r#type: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<SqlUuid>)]
        grant_id: Option<Uuid>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
        amount: Option<i64>,
    }
    for (index, expected) in model.events.iter().enumerate() {
        let actual: Vec<ShownEvent> = diesel::sql_query(
            "SELECT type, (data->>'grant_id')::uuid AS grant_id, \
                    (data->>'amount')::bigint AS amount \
             FROM events WHERE account_id = $1 AND type NOT LIKE 'job.%' ORDER BY seq",
        )
        .bind::<SqlUuid, _>(real.accounts[index])
        .load::<Event>(conn)
        .expect("events")
        .into_iter()
        .map(|event| {
            let grant = event
                .r#type
                .starts_with("grant.")
                .then(|| (model_grant(real, event.grant_id), event.amount));
            (event.r#type, grant)
        })
        .collect();
        let expected: Vec<ShownEvent> = expected
            .iter()
            .map(|&(kind, grant)| {
                (
                    kind.to_owned(),
                    grant.map(|(grant, amount)| (Some(grant), Some(amount))),
                )
            })
            .collect();
        assert_eq!(actual, expected, "events of account {index}");
    }
    let disagreements =
        token_billing::domain::checks::events_disagreeing_with_books(conn).expect("events check");
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

/// A kiosk key of `account`, revoked through the API.
async fn revoked_key(app: &TestApp, account: Uuid) -> String {
    let created: Value = app
        .post(
            &format!("/v1/accounts/{account}/api-keys"),
            ADMIN_KEY,
            &json!({"scope": "kiosk", "label": "revoked"}),
        )
        .await
        .json()
        .await
        .expect("json");
    let id = created["key_id"].as_str().expect("key id");
    let response = app
        .client
        .delete(app.url(&format!("/v1/api-keys/{id}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status().as_u16(), 204);
    created["key"].as_str().expect("key").to_owned()
}

/// A kiosk key of `account` whose expiry has passed (set in the database
/// before the key is ever used, so no replica has it cached).
async fn expired_key(app: &TestApp, account: Uuid, conn: &mut PgConnection) -> String {
    let created: Value = app
        .post(
            &format!("/v1/accounts/{account}/api-keys"),
            ADMIN_KEY,
            &json!({"scope": "kiosk", "label": "expired"}),
        )
        .await
        .json()
        .await
        .expect("json");
    let id: Uuid = created["key_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("key id");
    diesel::sql_query("UPDATE api_keys SET expires_at = now() - interval '1 minute' WHERE id = $1")
        .bind::<SqlUuid, _>(id)
        .execute(conn)
        .expect("expire key");
    created["key"].as_str().expect("key").to_owned()
}

/// Runs `steps` on the service and the model and compares them.
async fn run_history(steps: &[Step]) {
    let settings = |config: &mut token_billing::config::Config| {
        // Workers and the reaper act only as the history's own steps
        // (Finish, Reaper): a background pass (every 30 s by default) would
        // expire aged reservations behind the model's back on a slow run.
        config.worker_concurrency = 0;
        config.reaper_schedule = "0 0 0 1 1 *".into();
        // Revoked and expired keys are refused on purpose, many times.
        config.auth_failure_burst = 1_000;
    };
    let app = TestApp::spawn_with(settings).await;
    let mut model = Model::default();
    let limits = [0, 2, 3];
    let mut accounts = Vec::new();
    let mut kiosks = Vec::new();
    for (limit, threshold) in limits.into_iter().zip(THRESHOLDS) {
        let account = app
            .create_account_from(&json!({
                "name": "differential",
                "max_active_reservations": limit,
                "low_balance_threshold": threshold,
            }))
            .await;
        model.create_account(limit, threshold);
        kiosks.push(app.kiosk_key(account).await);
        accounts.push(account);
    }
    let mut conn = app.database.connect();
    let keys = Keys {
        kiosks,
        revoked: revoked_key(&app, accounts[0]).await,
        expired: expired_key(&app, accounts[0], &mut conn).await,
        finance: app.finance_key().await,
    };
    let mut real = Real {
        app,
        accounts,
        keys,
        reservations: Vec::new(),
        jobs: Vec::new(),
        leases: Vec::new(),
        resolved: None,
        credit_refs: Vec::new(),
        adjustment_refs: Vec::new(),
        grants: Vec::new(),
        expiries: EXPIRY_HOURS
            .iter()
            .map(|&hours| {
                use chrono::{DurationRound, TimeDelta};
                (Utc::now() + TimeDelta::hours(hours))
                    .duration_trunc(TimeDelta::microseconds(1))
                    .expect("an instant PostgreSQL stores")
            })
            .collect(),
        requests: vec![Vec::new(); ACCOUNTS],
        job_requests: vec![Vec::new(); ACCOUNTS],
        next_request: 0,
    };
    for step in steps {
        run_step(&mut real, &mut model, step, &mut conn).await;
        compare_balances(&model, &real, &mut conn, step);
    }
    compare_final(&model, &real, &mut conn);
    compare_grant_list(&model, &real).await;
}

/// Every grant's status and lapse as the grants list shows them: expired
/// once its expiry has passed (lapse written or not), else active while
/// it holds tokens, else depleted.
async fn compare_grant_list(model: &Model, real: &Real) {
    for (account, &id) in real.accounts.iter().enumerate() {
        let response = real
            .app
            .get(&format!("/v1/accounts/{id}/grants"), ADMIN_KEY)
            .await;
        assert_eq!(response.status().as_u16(), 200);
        let page: Value = response.json().await.expect("grants page");
        assert!(page["next_after"].is_null(), "one page: {page}");
        let actual: Vec<(Option<usize>, String, bool)> = page["grants"]
            .as_array()
            .expect("grants")
            .iter()
            .map(|shown| {
                (
                    model_grant(real, uuid_of(&shown["grant_id"])),
                    shown["status"].as_str().expect("status").to_owned(),
                    shown["expired_at"].is_string(),
                )
            })
            .collect();
        let expected: Vec<(Option<usize>, String, bool)> = (0..model.grants.len())
            .filter(|&g| model.grants[g].account == account)
            .map(|g| {
                let grant = &model.grants[g];
                let status = if grant.expiry == Expiry::Passed {
                    "expired"
                } else if grant.remaining + grant.reserved > 0 {
                    "active"
                } else {
                    "depleted"
                };
                (Some(g), status.to_owned(), grant.lapse_written)
            })
            .collect();
        assert_eq!(actual, expected, "the grants list of account {account}");
    }
}

#[test]
fn the_service_answers_every_history_as_the_model_does() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cases = std::env::var("DIFFERENTIAL_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(property_config(cases));
    runner
        .run(&prop::collection::vec(step(), 10..60), |steps| {
            runtime.block_on(run_history(&steps));
            Ok(())
        })
        .expect("the service and the model agree");
}
