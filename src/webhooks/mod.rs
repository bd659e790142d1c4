//! Webhooks: endpoints (admin), Standard Webhooks signatures, the address
//! guard, and delivery from the event outbox.

pub mod delivery;
pub mod endpoints;
pub mod signing;
pub mod url_guard;
