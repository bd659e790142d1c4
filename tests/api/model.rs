//! A plain-Rust model of the money rules: in-memory accounts,
//! reservations, jobs and ledger, the rules written as plainly as they can
//! be read, with no SQL. The differential test (`differential.rs`) drives
//! the real service and this model with the same history and compares
//! every answer, balance, reservation and ledger entry. It shares no code
//! with the engine: a rule changed in one and not the other fails it.

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
    pub available: i64,
    pub reserved: i64,
    pub used: i64,
    pub credited: i64,
    pub adjusted: i64,
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobStatus {
    Queued,
    Succeeded,
    Failed,
}

#[derive(Clone, Debug)]
pub struct Job {
    pub account: usize,
    pub request: u64,
    pub seed: u64,
    pub reservation: usize,
    pub status: JobStatus,
}

/// One ledger entry: kind, amount, balances after.
pub type Entry = (&'static str, i64, i64, i64, i64);

#[derive(Default)]
pub struct Model {
    pub accounts: Vec<Account>,
    pub reservations: Vec<Reservation>,
    pub jobs: Vec<Job>,
    pub ledger: Vec<Vec<Entry>>,
    credits: HashMap<String, (usize, i64)>,
    adjustments: HashMap<String, (usize, i64)>,
}

impl Model {
    pub fn create_account(&mut self, limit: i64) -> usize {
        self.accounts.push(Account {
            limit,
            ..Account::default()
        });
        self.ledger.push(Vec::new());
        self.accounts.len() - 1
    }

    fn record(&mut self, account: usize, kind: &'static str, amount: i64) {
        let a = &self.accounts[account];
        let entry = (kind, amount, a.available, a.reserved, a.used);
        self.ledger[account].push(entry);
    }

    pub fn set_status(&mut self, account: usize, suspended: bool) -> Reply {
        self.accounts[account].suspended = suspended;
        ok(200)
    }

    pub fn set_limit(&mut self, account: usize, limit: i64) -> Reply {
        self.accounts[account].limit = limit;
        ok(200)
    }

    pub fn credit(&mut self, account: usize, amount: i64, reference: &str) -> Reply {
        if let Some(&(first_account, first_amount)) = self.credits.get(reference) {
            return if (first_account, first_amount) == (account, amount) {
                ok(200)
            } else {
                refused(422, "idempotency_key_reused")
            };
        }
        self.credits.insert(reference.to_owned(), (account, amount));
        let a = &mut self.accounts[account];
        a.available += amount;
        a.credited += amount;
        self.record(account, "credit", amount);
        ok(201)
    }

    pub fn adjust(&mut self, account: usize, amount: i64, reference: &str) -> Reply {
        if let Some(&(first_account, first_amount)) = self.adjustments.get(reference) {
            return if (first_account, first_amount) == (account, amount) {
                ok(200)
            } else {
                refused(422, "idempotency_key_reused")
            };
        }
        if self.accounts[account].available + amount < 0 {
            return refused(402, "insufficient_tokens");
        }
        self.adjustments
            .insert(reference.to_owned(), (account, amount));
        let a = &mut self.accounts[account];
        a.available += amount;
        a.adjusted += amount;
        self.record(account, "adjustment", amount);
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
        self.reservations.push(Reservation {
            account,
            request,
            amount,
            ttl,
            state: State::Held,
            committed: 0,
            past_expiry: false,
            job,
        });
        let a = &mut self.accounts[account];
        a.available -= amount;
        a.reserved += amount;
        a.active += 1;
        self.record(account, "reserve", amount);
        self.reservations.len() - 1
    }

    /// A reservation by the API. Returns the reply and the reservation (new
    /// or replayed).
    pub fn reserve(
        &mut self,
        account: usize,
        request: u64,
        amount: i64,
        ttl: Option<i32>,
    ) -> (Reply, Option<usize>) {
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
    /// spent, the rest back to available.
    fn settle(&mut self, index: usize, state: State, committed: i64) {
        let (account, amount) = (
            self.reservations[index].account,
            self.reservations[index].amount,
        );
        let returned = amount - committed;
        self.reservations[index].state = state;
        self.reservations[index].committed = committed;
        let a = &mut self.accounts[account];
        a.active -= 1;
        if committed > 0 {
            a.reserved -= committed;
            a.used += committed;
            self.record(account, "commit", committed);
        }
        if returned > 0 {
            let a = &mut self.accounts[account];
            a.reserved -= returned;
            a.available += returned;
            let kind = if state == State::Expired {
                "expire"
            } else {
                "release"
            };
            self.record(account, kind, returned);
        }
    }

    fn expire_if_due(&mut self, index: usize) -> bool {
        let r = &self.reservations[index];
        if r.state == State::Held && r.past_expiry {
            self.settle(index, State::Expired, 0);
            return true;
        }
        false
    }

    /// Commit (`amount`: default all held) or release by the API.
    pub fn resolve(&mut self, account: usize, index: usize, commit: Option<Option<i64>>) -> Reply {
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

    pub fn extend(&mut self, account: usize, index: usize) -> Reply {
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
        });
        (ok(201), Some(job))
    }

    /// A worker finishes a queued job: success commits its cost, failure
    /// releases it; a reservation past its expiry is expired and the job
    /// fails. A job no longer queued is not touched.
    pub fn finish_job(&mut self, job: usize, success: bool) {
        if self.jobs[job].status != JobStatus::Queued {
            return;
        }
        let index = self.jobs[job].reservation;
        if self.expire_if_due(index) {
            self.jobs[job].status = JobStatus::Failed;
            return;
        }
        let amount = self.reservations[index].amount;
        if success {
            self.settle(index, State::Committed, amount);
            self.jobs[job].status = JobStatus::Succeeded;
        } else {
            self.settle(index, State::Released, 0);
            self.jobs[job].status = JobStatus::Failed;
        }
    }

    /// The reaper: every held reservation past its expiry expires, its
    /// unfinished job fails. `order` lists the reservations in the order
    /// the reaper takes them (by account, then id).
    pub fn reaper_pass(&mut self, order: &[usize]) {
        for &index in order {
            if self.expire_if_due(index) {
                if let Some(job) = self.reservations[index].job {
                    if self.jobs[job].status == JobStatus::Queued {
                        self.jobs[job].status = JobStatus::Failed;
                    }
                }
            }
        }
    }
}
