//! Following the primary through a failover.
//!
//! `DATABASE_URL` may list several hosts with
//! `target_session_attrs=read-write`: libpq then connects to whichever host
//! accepts writes. What remains is to stop using connections to a primary
//! that is gone. Rules:
//!
//! - an error that means "this connection is dead or points at a server
//!   that cannot take writes" (`crate::error`'s classification) marks the
//!   thread that holds the connection ([`connection_lost`], kept in
//!   `crate::error` so that the error layer needs nothing above it);
//! - when that connection goes back to the pool, [`has_broken`] sees the
//!   mark and r2d2 discards it instead of handing it out again;
//! - for [`SUSPICION`] after any loss, every checkout pings the idle
//!   connection first (`is_valid`), so the other dead connections of the
//!   pool are dropped without failing a request;
//! - a connection that has run nothing for [`IDLE_CHECK`] or longer is
//!   pinged before it is handed out, whatever happened meanwhile: a server
//!   restart that no request saw (the pool was quiet) leaves idle
//!   connections dead, and the first request after the lull must not get
//!   one. Each connection's diesel instrumentation ([`LastUse`]) notes when
//!   it last ran a statement. A busy connection costs nothing (no `SELECT
//!   1` per request);
//! - a new connection that fails (no primary yet: the standby is being
//!   promoted) is tried again every 100 ms for 3 s before the attempt
//!   counts as failed.
//!
//! [`has_broken`]: r2d2::ManageConnection::has_broken

use std::time::{Duration, Instant};

use diesel::connection::{Connection, Instrumentation, InstrumentationEvent};
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, R2D2Connection};

/// How long after a lost connection every checkout is checked first.
pub const SUSPICION: Duration = Duration::from_secs(10);
/// A pooled connection idle this long is checked before it is handed out.
pub const IDLE_CHECK: Duration = Duration::from_secs(10);
/// A failed connection attempt is repeated every `RECONNECT_POLL` for up to
/// `RECONNECT_WINDOW` before it counts as failed: r2d2's own retries back
/// off to 2.5 s apart, which would leave a promoted standby unused for
/// seconds, and requests waiting on the pool meanwhile.
const RECONNECT_POLL: Duration = Duration::from_millis(100);
const RECONNECT_WINDOW: Duration = Duration::from_secs(3);

pub use crate::error::{connection_lost, lost_on_this_thread};

/// True within `SUSPICION` of the last [`connection_lost`].
pub fn recently_lost() -> bool {
    crate::error::lost_within(SUSPICION)
}

/// When a connection last ran a statement: diesel tells a connection's
/// instrumentation of every statement (start and finish) and transaction.
#[derive(Debug)]
struct LastUse(Instant);

impl Instrumentation for LastUse {
    fn on_connection_event(&mut self, _: InstrumentationEvent<'_>) {
        self.0 = Instant::now();
    }
}

/// How long `conn` has run nothing (forever for a connection that was not
/// made by [`FailoverAwareManager::connect`]).
fn idle_for(conn: &mut PgConnection) -> Duration {
    conn.instrumentation()
        .downcast_ref::<LastUse>()
        .map_or(Duration::MAX, |last| last.0.elapsed())
}

/// diesel's r2d2 manager, plus discarding what a failover left dead.
#[derive(Debug)]
pub struct FailoverAwareManager {
    inner: ConnectionManager<PgConnection>,
}

impl FailoverAwareManager {
    pub fn new(inner: ConnectionManager<PgConnection>) -> FailoverAwareManager {
        FailoverAwareManager { inner }
    }
}

impl r2d2::ManageConnection for FailoverAwareManager {
    type Connection = PgConnection;
    type Error = diesel::r2d2::Error;

    fn connect(&self) -> Result<PgConnection, Self::Error> {
        let deadline = Instant::now() + RECONNECT_WINDOW;
        loop {
            match self.inner.connect() {
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(RECONNECT_POLL);
                }
                Ok(mut conn) => {
                    conn.set_instrumentation(LastUse(Instant::now()));
                    return Ok(conn);
                }
                failed => return failed,
            }
        }
    }

    fn is_valid(&self, conn: &mut PgConnection) -> Result<(), Self::Error> {
        if recently_lost() || idle_for(conn) >= IDLE_CHECK {
            conn.ping().map_err(diesel::r2d2::Error::QueryError)
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        let lost = crate::error::take_lost_on_this_thread();
        lost || self.inner.has_broken(conn)
    }
}
