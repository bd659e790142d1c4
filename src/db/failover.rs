//! Following the primary through a failover.
//!
//! `DATABASE_URL` may list several hosts with
//! `target_session_attrs=read-write`: libpq then connects to whichever host
//! accepts writes. What remains is to stop using connections to a primary
//! that is gone. Rules:
//!
//! - an error that means "this connection is dead or points at a server
//!   that cannot take writes" (`crate::error`'s classification) calls
//!   [`connection_lost`] on the thread that holds the connection;
//! - when that connection goes back to the pool, [`has_broken`] sees the
//!   mark and r2d2 discards it instead of handing it out again;
//! - for [`SUSPICION`] after any loss, every checkout pings the idle
//!   connection first (`is_valid`), so the other dead connections of the
//!   pool are dropped without failing a request. Outside that window a
//!   checkout costs nothing (no `SELECT 1` per request);
//! - a new connection that fails (no primary yet: the standby is being
//!   promoted) is tried again every 100 ms for 3 s before the attempt
//!   counts as failed.
//!
//! [`has_broken`]: r2d2::ManageConnection::has_broken

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, R2D2Connection};

/// How long after a lost connection every checkout is checked first.
pub const SUSPICION: Duration = Duration::from_secs(10);
/// A failed connection attempt is repeated every `RECONNECT_POLL` for up to
/// `RECONNECT_WINDOW` before it counts as failed: r2d2's own retries back
/// off to 2.5 s apart, which would leave a promoted standby unused for
/// seconds, and requests waiting on the pool meanwhile.
const RECONNECT_POLL: Duration = Duration::from_millis(100);
const RECONNECT_WINDOW: Duration = Duration::from_secs(3);

thread_local! {
    /// Set when a statement on this thread failed because its connection
    /// is unusable; read (and cleared) when that connection is returned.
    static LOST_ON_THIS_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Milliseconds since `EPOCH` of the last loss, plus one (0: none yet).
static LAST_LOSS_MS: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ms() -> u64 {
    let epoch = EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

/// Records that the connection in use on this thread is unusable (the
/// server went away, or it no longer accepts writes).
pub fn connection_lost() {
    LOST_ON_THIS_THREAD.with(|lost| lost.set(true));
    LAST_LOSS_MS.store(now_ms(), Ordering::Relaxed);
}

/// True when the connection in use on this thread was found unusable
/// (until it is returned to the pool).
pub fn lost_on_this_thread() -> bool {
    LOST_ON_THIS_THREAD.with(Cell::get)
}

/// True within `SUSPICION` of the last [`connection_lost`].
pub fn recently_lost() -> bool {
    let last = LAST_LOSS_MS.load(Ordering::Relaxed);
    last != 0 && now_ms().saturating_sub(last) < SUSPICION.as_millis() as u64
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
                connected => return connected,
            }
        }
    }

    fn is_valid(&self, conn: &mut PgConnection) -> Result<(), Self::Error> {
        if recently_lost() {
            conn.ping().map_err(diesel::r2d2::Error::QueryError)
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        let lost = LOST_ON_THIS_THREAD.with(Cell::take);
        lost || self.inner.has_broken(conn)
    }
}
