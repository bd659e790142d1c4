//! Top-ups (credits) and signed corrections (adjustments).
//!
//! Both are movements of the money engine (`engine_credit`,
//! `engine_adjust`), idempotent on `external_ref`. A replay answers with
//! the balances recorded in the original ledger entry, so it is the same
//! answer; a reuse with a different body is refused and changes nothing.
//! Their representation is the engine's (`crate::engine::credits`).

pub use crate::engine::credits::{AdjustmentView, CreditView};
