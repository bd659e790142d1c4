//! A plain-Rust model of the money rules: in-memory accounts,
//! reservations, jobs, keys, events and ledger, the rules written as the
//! docs state them (docs/api.md, docs/architecture.md), with no SQL and
//! without the engine's order of checks. The differential test (`differential.rs`) drives
//! the real service and this model with the same history and compares
//! every answer, balance, reservation and ledger entry. It shares no code
//! with the engine: a rule changed in one and not the other fails it.
//!
//! Credit grants: every credit and positive adjustment is a grant with a
//! priority and an expiry (one of a few fixed future instants, or never);
//! spending draws from an account's grants in draw order — here a sort of
//! the account's grants by (priority, expiry, creation index), taking from
//! each in turn until the amount is met. (The engine decides the same
//! order set-based: running sums over its grants ordered by priority,
//! expiry and creation sequence, intersected with running sums of the
//! items.)
//!
//! Grant expiry: a grant's expiry can pass (the test moves it to now), and
//! then the grant has lapsed; its lapse — what it still holds leaves
//! `available` as one `grant_expire` entry and a `grant.expired` event —
//! is written by the next spending decision on its account (a reserve or a
//! job, whatever its answer once the key may spend; a removal, whatever its
//! answer) when it holds remaining tokens, or by the reaper's pass,
//! whichever comes first; the lapse of a grant that holds none (all of it
//! reserved, consumed or taken) is written by the reaper only. A credit or a
//! positive adjustment writes none. A settlement's return to a grant whose
//! expiry has passed (lapse written or not) leaves `reserved` as a
//! `grant_expire` entry (naming the reservation) instead of going back.
//! An extension (by the API, or a job's heartbeat) never carries drawn
//! tokens past their grant's expiry: one of a reservation that drew from
//! a grant whose expiry has passed is capped — the reservation keeps the
//! expiry it had, and the API's answer says `Extension-Capped` (here the
//! reply's code `extension_capped`).
//! The reaper's pass writes every lapse first, then one `grant.expiring`
//! notice per grant that lapses within the notice window, has not lapsed,
//! holds tokens and was not noticed before.

use std::collections::HashMap;

/// An answer as the API gives it: the HTTP status and, for an error, the
/// problem's `code`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub code: Option<&'static str>,
}

fn ok(status: u16) -> Reply {
    Reply { status, code: None }
}

fn refused(status: u16, code: &'static str) -> Reply {
    Reply {
        status,
        code: Some(code),
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Account {
    pub suspended: bool,
    pub limit: i64,
    /// `low_balance_threshold` (0: off) and whether the account is below it.
    pub threshold: i64,
    pub low: bool,
    pub available: i64,
    pub reserved: i64,
    pub used: i64,
    pub credited: i64,
    pub adjusted: i64,
    /// Tokens that left when grants lapsed.
    pub grant_expired: i64,
    pub active: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Held,
    Committed,
    Released,
    Expired,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Held => "held",
            State::Committed => "committed",
            State::Released => "released",
            State::Expired => "expired",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Reservation {
    pub account: usize,
    pub request: u64,
    pub amount: i64,
    pub ttl: Option<i32>,
    pub state: State,
    pub committed: i64,
    pub past_expiry: bool,
    pub job: Option<usize>,
    /// (grant, tokens) in draw order.
    pub draws: Vec<(usize, i64)>,
}

/// When a grant lapses, in draw order: a grant whose expiry has passed
/// sorts first (it is never drawn: its lapse is written before any draw),
/// then the history's fixed future instants by rank (a lower rank is
/// sooner), then never.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Expiry {
    Passed,
    At(u8),
    Never,
}

/// A credit grant: made by a credit or a positive adjustment, in creation
/// order (its index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub account: usize,
    pub priority: i64,
    pub remaining: i64,
    pub reserved: i64,
    pub expiry: Expiry,
    /// Its lapse is written (`expired_at` set).
    pub lapse_written: bool,
    /// Tokens that left with its lapse or by returns after it.
    pub expired: i64,
    /// Its `grant.expiring` notice was sent.
    pub noticed: bool,
}

/// A credit's priority when it names none.
pub const DEFAULT_PRIORITY: i64 = 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Job {
    pub account: usize,
    pub request: u64,
    pub seed: u64,
    pub reservation: usize,
    pub status: JobStatus,
    /// Claims so far, and the fencing token of the latest lease (every
    /// claim and every reaper requeue or finish moves it on).
    pub attempts: i32,
    pub token: i64,
    /// A running job whose lease ran out (its worker stopped).
    pub lease_expired: bool,
    /// The failure's code.
    pub error: Option<&'static str>,
}

/// Who calls: the keys of docs/api.md's scope rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Finance,
    /// A live kiosk key of this account.
    Kiosk(usize),
    Revoked,
    Expired,
}

/// What the engine tells a worker of one claimed job: the max-attempts
/// rule (`JOB_MAX_ATTEMPTS` attempts per job).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub job: usize,
    pub token: i64,
    pub attempts: i32,
    /// It had no attempt left before this claim.
    pub over_limit: bool,
    /// No retry may follow this attempt.
    pub last_attempt: bool,
}

/// One ledger entry: kind, amount, balances after.
pub type Entry = (&'static str, i64, i64, i64, i64);

/// The max-attempts rule as docs/architecture.md states it: a job is
/// attempted at most `JOB_MAX_ATTEMPTS` times.
fn no_attempt_left(attempts: i32, max_attempts: i32) -> bool {
    attempts >= max_attempts
}

/// An external movement's identity for replays: account, amount, the
/// note (credit) or reason (adjustment), and its grant's priority (none for
/// a removal). Its grant's expiry is compared too, as the grant has it
/// now (a grant whose expiry the test moved no longer has the one sent).
type External = (usize, i64, Option<String>, Option<i64>);

/// An event: its type, and for a grant's event the grant and its amount.
pub type Event = (&'static str, Option<(usize, i64)>);

fn event(kind: &'static str) -> Event {
    (kind, None)
}

#[derive(Clone, Default)]
pub struct Model {
    pub accounts: Vec<Account>,
    pub reservations: Vec<Reservation>,
    pub jobs: Vec<Job>,
    pub ledger: Vec<Vec<Entry>>,
    /// The grant each ledger entry names, parallel to `ledger`.
    pub entry_grants: Vec<Vec<Option<usize>>>,
    /// The reservation each ledger entry names, parallel to `ledger`.
    pub entry_reservations: Vec<Vec<Option<usize>>>,
    pub grants: Vec<Grant>,
    /// Each account's events (other than jobs'), in order.
    pub events: Vec<Vec<Event>>,
    /// Each external reference's identity and the grant it made.
    credits: HashMap<String, (External, Option<usize>)>,
    adjustments: HashMap<String, (External, Option<usize>)>,
}

impl Model {
    /// A new account; it starts empty, so one created with a threshold is
    /// low from the start (reported at creation).
    pub fn create_account(&mut self, limit: i64, threshold: i64) -> usize {
        self.accounts.push(Account {
            limit,
            threshold,
            low: threshold > 0,
            ..Account::default()
        });
        self.ledger.push(Vec::new());
        self.entry_grants.push(Vec::new());
        self.entry_reservations.push(Vec::new());
        self.events.push(if threshold > 0 {
            vec![event("account.balance_low")]
        } else {
            Vec::new()
        });
        self.accounts.len() - 1
    }

    /// One ledger entry naming `grant` (and `reservation`), and the events
    /// it causes: its movement's own (credit, adjustment, expiry: once, on
    /// the movement's `last` entry of its kind; a grant's expiry: on every
    /// `grant_expire` entry), a crossing of the low-balance threshold
    /// either way, and a depletion (available reaching 0 from above).
    fn record(
        &mut self,
        account: usize,
        kind: &'static str,
        amount: i64,
        grant: Option<usize>,
        reservation: Option<usize>,
        last: bool,
    ) {
        let a = &self.accounts[account];
        let entry = (kind, amount, a.available, a.reserved, a.used);
        let before = self.ledger[account]
            .last()
            .map_or(0, |&(_, _, available, _, _)| available);
        self.ledger[account].push(entry);
        self.entry_grants[account].push(grant);
        self.entry_reservations[account].push(reservation);
        let events = &mut self.events[account];
        match kind {
            "credit" if last => events.push(event("credit.created")),
            "adjustment" if last => events.push(event("adjustment.created")),
            "expire" if last => events.push(event("reservation.expired")),
            "grant_expire" => {
                events.push((
                    "grant.expired",
                    Some((grant.expect("a grant_expire names its grant"), amount)),
                ));
                // The last return of an expiry: its reservation.expired.
                if last && reservation.is_some_and(|r| self.reservations[r].state == State::Expired)
                {
                    events.push(event("reservation.expired"));
                }
            }
            _ => {}
        }
        let a = &mut self.accounts[account];
        let below = a.threshold > 0 && a.available < a.threshold;
        if below != a.low {
            a.low = below;
            events.push(event(if below {
                "account.balance_low"
            } else {
                "account.balance_recovered"
            }));
        }
        if a.available == 0 && before > 0 {
            events.push(event("account.balance_depleted"));
        }
    }

    pub fn set_status(&mut self, account: usize, suspended: bool) -> Reply {
        self.accounts[account].suspended = suspended;
        ok(200)
    }

    pub fn set_limit(&mut self, account: usize, limit: i64) -> Reply {
        self.accounts[account].limit = limit;
        ok(200)
    }

    /// A new threshold: the low state follows at once, with its event when
    /// it changes; switching it off (0) forgets the state silently.
    pub fn set_threshold(&mut self, account: usize, threshold: i64) -> Reply {
        let a = &mut self.accounts[account];
        a.threshold = threshold;
        let below = threshold > 0 && a.available < threshold;
        if below != a.low {
            a.low = below;
            if threshold > 0 {
                self.events[account].push(event(if below {
                    "account.balance_low"
                } else {
                    "account.balance_recovered"
                }));
            }
        }
        ok(200)
    }

    /// Who may spend on `account` (reserve, commit, release, extend, jobs).
    pub fn may_spend(caller: Caller, account: usize) -> Result<(), Reply> {
        match caller {
            Caller::Revoked | Caller::Expired => Err(refused(401, "unauthorized")),
            Caller::Finance => Err(refused(403, "forbidden")),
            Caller::Kiosk(own) if own != account => Err(refused(404, "not_found")),
            Caller::Kiosk(_) | Caller::Admin => Ok(()),
        }
    }

    /// A new grant of `amount` tokens on `account`.
    fn grant(&mut self, account: usize, amount: i64, priority: i64, expiry: Expiry) -> usize {
        self.grants.push(Grant {
            account,
            priority,
            remaining: amount,
            reserved: 0,
            expiry,
            lapse_written: false,
            expired: 0,
            noticed: false,
        });
        self.grants.len() - 1
    }

    /// The grant's expiry passes now (the test moves it): it has lapsed,
    /// and its lapse is not written yet.
    pub fn pass_expiry(&mut self, grant: usize) {
        self.grants[grant].expiry = Expiry::Passed;
    }

    /// Writes the lapse of every grant of `account` whose expiry has
    /// passed and whose lapse is not written yet, in creation order: what
    /// it still holds leaves `available` (one `grant_expire` entry). What
    /// reservations drew from it stays reserved. A spend or a removal
    /// (`holding_only`) writes the lapse of the grants that hold remaining
    /// tokens; the reaper also marks those that hold none.
    fn lapse(&mut self, account: usize, holding_only: bool) {
        for index in 0..self.grants.len() {
            let grant = &mut self.grants[index];
            if grant.account != account
                || grant.expiry != Expiry::Passed
                || grant.lapse_written
                || (holding_only && grant.remaining == 0)
            {
                continue;
            }
            grant.lapse_written = true;
            let left = std::mem::take(&mut grant.remaining);
            if left > 0 {
                grant.expired += left;
                let a = &mut self.accounts[account];
                a.available -= left;
                a.grant_expired += left;
                self.record(account, "grant_expire", left, Some(index), None, true);
            }
        }
    }

    /// Which grants `amount` tokens of `account` come from, in draw order:
    /// lowest priority first, then the soonest expiry (never: last), then
    /// the older grant.
    fn draw(&self, account: usize, amount: i64) -> Vec<(usize, i64)> {
        let mut candidates: Vec<usize> = (0..self.grants.len())
            .filter(|&g| self.grants[g].account == account && self.grants[g].remaining > 0)
            .collect();
        assert!(
            candidates
                .iter()
                .all(|&g| self.grants[g].expiry != Expiry::Passed),
            "the model draws only after writing the lapses"
        );
        candidates.sort_by_key(|&g| (self.grants[g].priority, self.grants[g].expiry, g));
        let mut wanted = amount;
        let mut draws = Vec::new();
        for g in candidates {
            if wanted == 0 {
                break;
            }
            let take = wanted.min(self.grants[g].remaining);
            draws.push((g, take));
            wanted -= take;
        }
        assert_eq!(wanted, 0, "the model's grants hold its available tokens");
        draws
    }

    /// Whether an external movement is the same as the first one of its
    /// reference: the same identity, and its grant's expiry as the grant
    /// has it now (no grant: none asked).
    fn same_external(
        &self,
        first: &(External, Option<usize>),
        this: &External,
        expiry: Expiry,
    ) -> bool {
        let (identity, grant) = first;
        let expiry_then = grant.map_or(Expiry::Never, |g| self.grants[g].expiry);
        identity == this && expiry_then == expiry
    }

    /// A credit makes a grant of `priority` (the default when none) lapsing
    /// at `expiry`.
    pub fn credit(
        &mut self,
        account: usize,
        amount: i64,
        note: Option<&str>,
        priority: Option<i64>,
        expiry: Expiry,
        reference: &str,
    ) -> Reply {
        let priority = priority.unwrap_or(DEFAULT_PRIORITY);
        let this = (account, amount, note.map(str::to_owned), Some(priority));
        // One namespace: a reference an adjustment holds is never a credit's.
        if self.adjustments.contains_key(reference) {
            return refused(422, "idempotency_key_reused");
        }
        if let Some(first) = self.credits.get(reference) {
            return if self.same_external(first, &this, expiry) {
                ok(200)
            } else {
                refused(422, "idempotency_key_reused")
            };
        }
        let grant = self.grant(account, amount, priority, expiry);
        self.credits
            .insert(reference.to_owned(), (this, Some(grant)));
        let a = &mut self.accounts[account];
        a.available += amount;
        a.credited += amount;
        self.record(account, "credit", amount, Some(grant), None, true);
        ok(201)
    }

    /// A positive adjustment makes a grant; a removal takes no priority
    /// and no expiry, writes the lapses of the account's grants first (a
    /// spending decision, whatever its answer), and draws from the grants
    /// in draw order, one entry per grant.
    pub fn adjust(
        &mut self,
        account: usize,
        amount: i64,
        reason: &str,
        priority: Option<i64>,
        expiry: Expiry,
        reference: &str,
    ) -> Reply {
        if amount < 0 && (priority.is_some() || expiry != Expiry::Never) {
            return refused(400, "invalid_request");
        }
        if amount < 0 {
            self.lapse(account, true);
        }
        let priority = (amount > 0).then(|| priority.unwrap_or(DEFAULT_PRIORITY));
        let this = (account, amount, Some(reason.to_owned()), priority);
        // One namespace: a reference a credit holds is never an adjustment's.
        if self.credits.contains_key(reference) {
            return refused(422, "idempotency_key_reused");
        }
        if let Some(first) = self.adjustments.get(reference) {
            return if self.same_external(first, &this, expiry) {
                ok(200)
            } else {
                refused(422, "idempotency_key_reused")
            };
        }
        if self.accounts[account].available + amount < 0 {
            return refused(402, "insufficient_tokens");
        }
        if let Some(priority) = priority {
            let grant = self.grant(account, amount, priority, expiry);
            self.adjustments
                .insert(reference.to_owned(), (this, Some(grant)));
            let a = &mut self.accounts[account];
            a.available += amount;
            a.adjusted += amount;
            self.record(account, "adjustment", amount, Some(grant), None, true);
        } else {
            self.adjustments.insert(reference.to_owned(), (this, None));
            let draws = self.draw(account, -amount);
            let last = draws.len() - 1;
            for (i, (grant, take)) in draws.into_iter().enumerate() {
                self.grants[grant].remaining -= take;
                let a = &mut self.accounts[account];
                a.available -= take;
                a.adjusted -= take;
                self.record(account, "adjustment", -take, Some(grant), None, i == last);
            }
        }
        ok(201)
    }

    /// Whether `account` may hold `amount` more tokens now, or why not.
    fn may_reserve(&self, account: usize, amount: i64) -> Result<(), Reply> {
        let a = &self.accounts[account];
        if a.suspended {
            Err(refused(409, "account_suspended"))
        } else if a.available < amount {
            Err(refused(402, "insufficient_tokens"))
        } else if a.limit > 0 && a.active >= a.limit {
            Err(refused(429, "too_many_active_reservations"))
        } else {
            Ok(())
        }
    }

    fn hold(
        &mut self,
        account: usize,
        request: u64,
        amount: i64,
        ttl: Option<i32>,
        job: Option<usize>,
    ) -> usize {
        let draws = self.draw(account, amount);
        let index = self.reservations.len();
        self.reservations.push(Reservation {
            account,
            request,
            amount,
            ttl,
            state: State::Held,
            committed: 0,
            past_expiry: false,
            job,
            draws: draws.clone(),
        });
        self.accounts[account].active += 1;
        for (grant, take) in draws {
            let g = &mut self.grants[grant];
            g.remaining -= take;
            g.reserved += take;
            let a = &mut self.accounts[account];
            a.available -= take;
            a.reserved += take;
            self.record(account, "reserve", take, Some(grant), Some(index), false);
        }
        index
    }

    /// A reservation by the API. Returns the reply and the reservation (new
    /// or replayed).
    pub fn reserve(
        &mut self,
        caller: Caller,
        account: usize,
        request: u64,
        amount: i64,
        ttl: Option<i32>,
    ) -> (Reply, Option<usize>) {
        if let Err(reply) = Model::may_spend(caller, account) {
            return (reply, None);
        }
        // A spending decision: the lapses first, whatever its answer.
        self.lapse(account, true);
        let existing = self
            .reservations
            .iter()
            .position(|r| r.account == account && r.request == request && r.job.is_none());
        if let Some(index) = existing {
            let r = &self.reservations[index];
            return if r.amount == amount && r.ttl == ttl {
                (ok(200), Some(index))
            } else {
                (refused(422, "idempotency_key_reused"), None)
            };
        }
        if let Err(reply) = self.may_reserve(account, amount) {
            return (reply, None);
        }
        (
            ok(201),
            Some(self.hold(account, request, amount, ttl, None)),
        )
    }

    /// Moves a held reservation to its final state: `committed` tokens
    /// spent, taken from its draws in draw order; the rest of each draw
    /// back to its grant — or, to a grant whose expiry has passed, out of
    /// the account (`grant_expire`, from reserved). The commits first, then
    /// the returns, one entry per grant.
    fn settle(&mut self, index: usize, state: State, committed: i64) {
        let account = self.reservations[index].account;
        self.reservations[index].state = state;
        self.reservations[index].committed = committed;
        self.accounts[account].active -= 1;
        let mut spent_before = 0;
        let mut parts = Vec::new();
        for &(grant, drawn) in &self.reservations[index].draws {
            let spent = (committed - spent_before).clamp(0, drawn);
            parts.push((grant, spent, drawn - spent));
            spent_before += drawn;
        }
        for &(grant, spent, _) in &parts {
            if spent > 0 {
                self.grants[grant].reserved -= spent;
                let a = &mut self.accounts[account];
                a.reserved -= spent;
                a.used += spent;
                self.record(account, "commit", spent, Some(grant), Some(index), false);
            }
        }
        let kind = if state == State::Expired {
            "expire"
        } else {
            "release"
        };
        let returns: Vec<(usize, i64)> = parts
            .iter()
            .filter(|&&(_, _, back)| back > 0)
            .map(|&(grant, _, back)| (grant, back))
            .collect();
        let lapsed = |model: &Model, grant: usize| model.grants[grant].expiry == Expiry::Passed;
        // An expiry's `reservation.expired` comes once, with its last
        // return, whether that return went back (`expire`) or expired with
        // a lapsed grant (`grant_expire`, after that entry's
        // `grant.expired`).
        let last = returns.len().checked_sub(1);
        for (i, (grant, back)) in returns.into_iter().enumerate() {
            let gone = lapsed(self, grant);
            let g = &mut self.grants[grant];
            g.reserved -= back;
            let a = &mut self.accounts[account];
            a.reserved -= back;
            if gone {
                g.expired += back;
                a.grant_expired += back;
                self.record(
                    account,
                    "grant_expire",
                    back,
                    Some(grant),
                    Some(index),
                    Some(i) == last,
                );
            } else {
                g.remaining += back;
                a.available += back;
                self.record(
                    account,
                    kind,
                    back,
                    Some(grant),
                    Some(index),
                    Some(i) == last,
                );
            }
        }
    }

    /// Expiry dominates: a held reservation past its expiry expires before
    /// anything else may touch it; its unfinished job fails.
    fn expire_if_due(&mut self, index: usize) -> bool {
        let r = &self.reservations[index];
        if r.state == State::Held && r.past_expiry {
            self.settle(index, State::Expired, 0);
            if let Some(job) = self.reservations[index].job {
                self.fail_unfinished(job, "reservation_expired");
            }
            return true;
        }
        false
    }

    fn fail_unfinished(&mut self, job: usize, code: &'static str) {
        let job = &mut self.jobs[job];
        if matches!(job.status, JobStatus::Queued | JobStatus::Running) {
            job.status = JobStatus::Failed;
            job.error = Some(code);
            job.lease_expired = false;
        }
    }

    /// Commit (`amount`: default all held) or release by the API. A retry
    /// of a commit or release that already happened is answered 200 only
    /// when it asks for the same thing (the same amount committed).
    pub fn resolve(
        &mut self,
        caller: Caller,
        account: usize,
        index: usize,
        commit: Option<Option<i64>>,
    ) -> Reply {
        if let Err(reply) = Model::may_spend(caller, account) {
            return reply;
        }
        let r = self.reservations[index].clone();
        if r.account != account {
            return refused(404, "not_found");
        }
        if r.job.is_some() {
            return refused(409, "reservation_owned_by_job");
        }
        if r.state != State::Held {
            let same = match commit {
                Some(amount) => {
                    r.state == State::Committed && r.committed == amount.unwrap_or(r.amount)
                }
                None => r.state == State::Released,
            };
            return if same {
                ok(200)
            } else {
                refused(409, "reservation_not_held")
            };
        }
        if let Some(Some(amount)) = commit {
            if amount > r.amount {
                return refused(400, "invalid_request");
            }
        }
        if self.expire_if_due(index) {
            return refused(409, "reservation_not_held");
        }
        match commit {
            Some(amount) => self.settle(index, State::Committed, amount.unwrap_or(r.amount)),
            None => self.settle(index, State::Released, 0),
        }
        ok(200)
    }

    /// An extension by the API. `reach`: the first expiry the asked
    /// instant does not reach — a drawn grant whose expiry comes before it
    /// (its expiry passed, or a sooner one) caps the extension.
    pub fn extend(&mut self, caller: Caller, account: usize, index: usize, reach: Expiry) -> Reply {
        if let Err(reply) = Model::may_spend(caller, account) {
            return reply;
        }
        let r = self.reservations[index].clone();
        if r.account != account {
            return refused(404, "not_found");
        }
        if r.job.is_some() {
            return refused(409, "reservation_owned_by_job");
        }
        if self.expire_if_due(index) || r.state != State::Held {
            return refused(409, "reservation_not_held");
        }
        // Grant expiry dominates extension: the extension reaches no
        // further than the earliest expiry of the grants the reservation
        // drew from. A drawn grant whose expiry comes before the asked
        // instant caps it: the reservation gets that expiry, or keeps the
        // one it had when that is later (it is not past it: that expired
        // it above) — less than it asked, and the answer says it was
        // capped.
        let capped = r
            .draws
            .iter()
            .any(|&(grant, _)| self.grants[grant].expiry < reach);
        if capped {
            return Reply {
                status: 200,
                code: Some("extension_capped"),
            };
        }
        self.reservations[index].past_expiry = false;
        ok(200)
    }

    /// A job of cost `cost` for `(account, request)` with params `seed`.
    pub fn create_job(
        &mut self,
        account: usize,
        request: u64,
        seed: u64,
        cost: i64,
    ) -> (Reply, Option<usize>) {
        // A spending decision: the lapses first, whatever its answer.
        self.lapse(account, true);
        if let Some(index) = self
            .jobs
            .iter()
            .position(|j| j.account == account && j.request == request)
        {
            return if self.jobs[index].seed == seed {
                (ok(200), Some(index))
            } else {
                (refused(422, "idempotency_key_reused"), None)
            };
        }
        if let Err(reply) = self.may_reserve(account, cost) {
            return (reply, None);
        }
        let job = self.jobs.len();
        let reservation = self.hold(account, request, cost, None, Some(job));
        self.jobs.push(Job {
            account,
            request,
            seed,
            reservation,
            status: JobStatus::Queued,
            attempts: 0,
            token: 0,
            lease_expired: false,
            error: None,
        });
        (ok(201), Some(job))
    }

    /// A worker's claim of every due job — queued ones, and running ones
    /// whose lease ran out — in creation order: each gets a new lease (the
    /// token moves on) and counts an attempt. No money moves.
    pub fn claim_due(&mut self, max_attempts: i32) -> Vec<Claim> {
        let mut claims = Vec::new();
        for (index, job) in self.jobs.iter_mut().enumerate() {
            let due = job.status == JobStatus::Queued
                || job.status == JobStatus::Running && job.lease_expired;
            if !due {
                continue;
            }
            job.status = JobStatus::Running;
            job.lease_expired = false;
            job.token += 1;
            job.attempts += 1;
            claims.push(Claim {
                job: index,
                token: job.token,
                attempts: job.attempts,
                over_limit: no_attempt_left(job.attempts - 1, max_attempts),
                last_attempt: no_attempt_left(job.attempts, max_attempts),
            });
        }
        claims
    }

    /// Whether a worker holding `token` still holds the job's lease.
    fn holds_lease(&self, job: usize, token: i64) -> bool {
        let job = &self.jobs[job];
        job.status == JobStatus::Running && job.token == token
    }

    /// A worker's heartbeat (`requeue`: false) or retryable failure
    /// (`requeue`: true, back to the queue at once): fenced on the lease;
    /// the reservation is extended, or, past its expiry, expires and the job
    /// fails. Returns `done`, `lease_lost` or `reservation_lost`.
    pub fn heartbeat(&mut self, job: usize, token: i64, requeue: bool) -> &'static str {
        if !self.holds_lease(job, token) {
            return "lease_lost";
        }
        let reservation = self.jobs[job].reservation;
        if self.expire_if_due(reservation) {
            return "reservation_lost";
        }
        self.reservations[reservation].past_expiry = false;
        let job = &mut self.jobs[job];
        job.lease_expired = false;
        if requeue {
            job.status = JobStatus::Queued;
            job.error = Some("provider_unavailable");
        }
        "done"
    }

    /// A worker's final answer, fenced on its lease: success commits the
    /// job's cost, failure (`error`) releases it. A reservation past its
    /// expiry expires instead, and a success then becomes a failure
    /// (`reservation_expired`, `reservation_lost`).
    pub fn finish(&mut self, job: usize, token: i64, error: Option<&'static str>) -> &'static str {
        if !self.holds_lease(job, token) {
            return "lease_lost";
        }
        let reservation = self.jobs[job].reservation;
        if self.expire_if_due(reservation) {
            if error.is_none() {
                return "reservation_lost";
            }
            let job = &mut self.jobs[job];
            job.status = JobStatus::Failed;
            job.error = error;
            return "done";
        }
        let amount = self.reservations[reservation].amount;
        let job = &mut self.jobs[job];
        job.lease_expired = false;
        match error {
            None => {
                job.status = JobStatus::Succeeded;
                job.error = None;
                self.settle(reservation, State::Committed, amount);
            }
            Some(code) => {
                job.status = JobStatus::Failed;
                job.error = Some(code);
                self.settle(reservation, State::Released, 0);
            }
        }
        "done"
    }

    /// A running job's worker stopped: its lease runs out.
    pub fn lapse_lease(&mut self, job: usize) {
        if self.jobs[job].status == JobStatus::Running {
            self.jobs[job].lease_expired = true;
        }
    }

    /// A finished job whose reservation was left held (a crash of an
    /// earlier version between the two writes).
    pub fn finish_without_settling(&mut self, job: usize, succeeded: bool) -> bool {
        let j = &self.jobs[job];
        let held = self.reservations[j.reservation].state == State::Held;
        if !matches!(j.status, JobStatus::Queued | JobStatus::Running) || !held {
            return false;
        }
        let j = &mut self.jobs[job];
        j.lease_expired = false;
        if succeeded {
            j.status = JobStatus::Succeeded;
        } else {
            j.status = JobStatus::Failed;
            j.error = Some("provider_failed");
        }
        true
    }

    /// The reaper, as docs/architecture.md's table lists its steps:
    /// write the lapses of grants whose expiry has passed; send one
    /// `grant.expiring` notice per grant that lapses within the notice
    /// window (`soon`, by expiry rank), has not lapsed, holds tokens and
    /// was not noticed (by expiry, then `grant_order`: the grants by id);
    /// expire held reservations past their expiry (`order`: by account,
    /// then reservation id), failing their unfinished jobs; requeue running
    /// jobs whose lease ran out and that have an attempt left; fail those
    /// without one (`attempts_exhausted`, tokens released); settle the held
    /// reservation of a finished job (commit a success, release a failure);
    /// fail unfinished jobs whose reservation is no longer held.
    pub fn reaper_pass(
        &mut self,
        order: &[usize],
        grant_order: &[usize],
        soon: &[bool],
        max_attempts: i32,
    ) {
        for account in 0..self.accounts.len() {
            self.lapse(account, false);
        }
        let mut noticed: Vec<(u8, usize)> = grant_order
            .iter()
            .filter_map(|&index| {
                let g = &self.grants[index];
                match g.expiry {
                    Expiry::At(rank)
                        if soon[usize::from(rank)]
                            && !g.noticed
                            && g.remaining + g.reserved > 0 =>
                    {
                        Some((rank, index))
                    }
                    _ => None,
                }
            })
            .collect();
        noticed.sort_by_key(|&(rank, _)| rank);
        for (_, index) in noticed {
            let g = &mut self.grants[index];
            g.noticed = true;
            let held = g.remaining + g.reserved;
            self.events[g.account].push(("grant.expiring", Some((index, held))));
        }
        for &index in order {
            self.expire_if_due(index);
        }
        for job in &mut self.jobs {
            if job.status == JobStatus::Running
                && job.lease_expired
                && !no_attempt_left(job.attempts, max_attempts)
            {
                job.status = JobStatus::Queued;
                job.lease_expired = false;
                job.token += 1;
            }
        }
        for index in 0..self.jobs.len() {
            let job = &self.jobs[index];
            if job.status == JobStatus::Running
                && job.lease_expired
                && no_attempt_left(job.attempts, max_attempts)
            {
                let reservation = job.reservation;
                let job = &mut self.jobs[index];
                job.status = JobStatus::Failed;
                job.error = Some("attempts_exhausted");
                job.lease_expired = false;
                job.token += 1;
                self.settle(reservation, State::Released, 0);
            }
        }
        for index in 0..self.jobs.len() {
            let (status, reservation) = (self.jobs[index].status, self.jobs[index].reservation);
            if self.reservations[reservation].state != State::Held {
                continue;
            }
            match status {
                JobStatus::Succeeded => {
                    let amount = self.reservations[reservation].amount;
                    self.settle(reservation, State::Committed, amount);
                }
                JobStatus::Failed => self.settle(reservation, State::Released, 0),
                JobStatus::Queued | JobStatus::Running => {}
            }
        }
        for index in 0..self.jobs.len() {
            if self.reservations[self.jobs[index].reservation].state != State::Held {
                self.fail_unfinished(index, "reservation_expired");
            }
        }
    }
}
