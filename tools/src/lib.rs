//! token-billing-tools: the test and operations tools of token-billing, a
//! crate of their own so that the service (`token-billing`) and its image
//! carry none of them. They use the service's library; the service's
//! integration tests use them (a dev-dependency). The load generators of
//! the benchmarks are a crate of their own too, `token-billing-bench`, in
//! `bench/` beside the scripts that run them.
//!
//! - [`chaos`]: the seeded fault run (`token-billing-tools chaos`);
//! - [`fake_provider`]: the fake provider served over HTTP
//!   (`token-billing-tools fake-provider`, and the tests' provider).

pub mod chaos;
pub mod fake_provider;
