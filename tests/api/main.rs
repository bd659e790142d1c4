//! One integration-test binary: real PostgreSQL (a database per test), the
//! real application on a free port, real HTTP.

mod helpers;

mod account_directory;
mod accounts;
mod auth;
mod auth_throttle;
mod backup;
mod bad_input;
mod cli;
mod coalescing;
mod concurrency;
mod console;
mod crash;
mod credits;
mod deployment;
mod differential;
mod distribution;
mod docs_agree;
mod failover;
mod fencing;
mod frozen_files;
mod grant_expiry;
mod grants;
mod history;
mod jobs;
mod json_numbers;
mod keys_audit;
mod layers;
mod lean;
mod ledger_property;
mod model;
mod newcomer;
mod no_secret_echoed;
mod openapi;
mod operate;
mod read_replica;
mod reaper;
mod receiver;
mod reconciliation;
mod representations;
mod reservations;
mod secrets;
mod security;
mod webhook_durability;
mod webhooks;
