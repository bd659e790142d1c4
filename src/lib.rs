//! token-billing: prepaid token billing for AI photo kiosks.

pub mod cli;
pub mod coalesce;
pub mod config;
pub mod db;
pub mod domain;
pub mod engine;
pub mod error;
pub mod job_watch;
pub mod metrics;
pub mod openapi;
pub mod provider;
pub mod rate_limit;
pub mod request_path;
pub mod routes;
pub mod scheduler;
pub mod secrets;
pub mod startup;
pub mod telemetry;
pub mod time;
pub mod webhooks;
pub mod worker;
