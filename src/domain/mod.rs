//! The rules of the service: synchronous functions that take a connection.

pub mod accounts;
pub mod api_keys;
pub mod audit;
pub mod checks;
pub mod credits;
pub mod events;
pub mod grants;
pub mod history;
pub mod idempotency;
pub mod job_leases;
pub mod jobs;
pub mod key_budgets;
pub mod ledger;
pub mod ledger_digest;
pub mod paging;
pub mod reaper;
pub mod reconciliation;
pub mod reservations;
pub mod retention;
pub mod revenue;
pub mod system;
pub mod topups;
pub mod usage;
