//! token-billing: prepaid token billing for AI photo kiosks.

pub mod cli;
pub mod config;
pub mod db;
pub mod domain;
pub mod error;
pub mod routes;
pub mod startup;
pub mod telemetry;
