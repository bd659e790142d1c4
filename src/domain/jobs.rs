//! Generation jobs: the validated request (the money engine creates the
//! job with its reservation, `engine_create_job`) and the reads. The
//! worker's fenced transitions live in `domain::job_leases`.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::JobRow;
use crate::db::schema::{generation_jobs, reservations};
use crate::db::states::{JobStatus, ReservationState};
use crate::domain::paging::page_of;
pub use crate::engine::jobs::{JobJson, JobRequest, JobReservation, JobView};
use crate::engine::types::{AccountId, RequestId};
use crate::error::ApiError;

pub fn find_job(
    conn: &mut PgConnection,
    account: AccountId,
    request_id: RequestId,
) -> Result<JobRow, ApiError> {
    generation_jobs::table
        .filter(generation_jobs::account_id.eq(account.0))
        .filter(generation_jobs::request_id.eq(request_id.0))
        .select(JobRow::as_select())
        .first(conn)
        .optional()?
        .ok_or(ApiError::NotFound("job"))
}

fn with_reservations(conn: &mut PgConnection, jobs: Vec<JobRow>) -> Result<Vec<JobView>, ApiError> {
    let ids: Vec<Uuid> = jobs.iter().map(|job| job.reservation_id).collect();
    type Held = (ReservationState, DateTime<Utc>, serde_json::Value);
    let states: std::collections::HashMap<Uuid, Held> = reservations::table
        .filter(reservations::id.eq_any(&ids))
        .select((
            reservations::id,
            reservations::state,
            reservations::expires_at,
            reservations::draws,
        ))
        .load::<(Uuid, ReservationState, DateTime<Utc>, serde_json::Value)>(conn)?
        .into_iter()
        .map(|(id, state, expires_at, draws)| (id, (state, expires_at, draws)))
        .collect();
    jobs.into_iter()
        .map(|job| {
            let reservation = states
                .get(&job.reservation_id)
                .cloned()
                .ok_or_else(|| ApiError::Internal(format!("job {} has no reservation", job.id)))?;
            Ok(JobView::from_row(job, reservation))
        })
        .collect()
}

pub fn job_view(conn: &mut PgConnection, job: JobRow) -> Result<JobView, ApiError> {
    with_reservations(conn, vec![job])?
        .pop()
        .ok_or_else(|| ApiError::Internal("job view missing".into()))
}

pub fn get_job(
    conn: &mut PgConnection,
    account: AccountId,
    request_id: RequestId,
) -> Result<JobView, ApiError> {
    let job = find_job(conn, account, request_id)?;
    job_view(conn, job)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    pub next_after: Option<Uuid>,
}

/// An account's jobs, newest first; `after` is the last job_id of the
/// previous page.
pub fn list_jobs(
    conn: &mut PgConnection,
    account: AccountId,
    status: Option<JobStatus>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<JobPage, ApiError> {
    let mut query = generation_jobs::table
        .filter(generation_jobs::account_id.eq(account.0))
        .select(JobRow::as_select())
        .order(generation_jobs::id.desc())
        .limit(limit + 1)
        .into_boxed();
    if let Some(status) = status {
        query = query.filter(generation_jobs::status.eq(status));
    }
    if let Some(after) = after {
        query = query.filter(generation_jobs::id.lt(after));
    }
    let (rows, next_after) = page_of(query.load(conn)?, limit, |job: &JobRow| job.id);
    Ok(JobPage {
        jobs: with_reservations(conn, rows)?,
        next_after,
    })
}

/// Of the given jobs, those that are terminal now (for waiting clients).
pub fn terminal_among(conn: &mut PgConnection, ids: &[Uuid]) -> Result<Vec<Uuid>, ApiError> {
    Ok(generation_jobs::table
        .filter(generation_jobs::id.eq_any(ids))
        .filter(generation_jobs::status.eq_any(JobStatus::TERMINAL))
        .select(generation_jobs::id)
        .load(conn)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::JOB_PARAMS_DEPTH_MAX;

    #[test]
    fn params_depth_is_bounded() {
        let prices = [("standard".to_owned(), 1)].into_iter().collect();
        let nested = |levels: usize| {
            let mut value = serde_json::json!(1);
            for _ in 0..levels {
                value = serde_json::json!({ "a": value });
            }
            value
        };
        let parse =
            |params| JobRequest::parse(RequestId(Uuid::nil()), "standard".into(), params, &prices);
        assert!(parse(nested(JOB_PARAMS_DEPTH_MAX)).is_ok());
        assert!(matches!(
            parse(nested(JOB_PARAMS_DEPTH_MAX + 1)),
            Err(ApiError::InvalidRequest(_))
        ));
    }

    #[test]
    fn hash_ignores_key_order_and_whitespace_but_not_values() {
        let make = |params: &str| JobRequest {
            request_id: RequestId(Uuid::nil()),
            kind: "standard".into(),
            cost: 1,
            params: serde_json::from_str(params).expect("json"),
        };
        let a = make(r#"{"prompt": "bride", "style": {"a": 1, "b": [1, 2]}}"#).hash();
        let b = make(r#"{"style":{"b":[1,2],"a":1},"prompt":"bride"}"#).hash();
        let c = make(r#"{"prompt": "groom", "style": {"a": 1, "b": [1, 2]}}"#).hash();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Integers beyond 64 bits are kept exactly, not rounded to a float.
        let big = make(r#"{"seed": 12345678901234567890123}"#);
        let other = make(r#"{"seed": 12345678901234567890999}"#);
        assert_ne!(big.hash(), other.hash());
        assert_eq!(
            big.params.to_string(),
            r#"{"seed":12345678901234567890123}"#
        );
    }

    #[test]
    fn a_nul_in_params_is_refused() {
        let prices = [("standard".to_owned(), 1)].into_iter().collect();
        for params in [
            r#"{"prompt": "a\u0000b"}"#,
            r#"{"a\u0000": 1}"#,
            r#"{"x": ["\u0000"]}"#,
        ] {
            let parsed = JobRequest::parse(
                RequestId(Uuid::nil()),
                "standard".into(),
                serde_json::from_str(params).expect("json"),
                &prices,
            );
            assert!(
                matches!(parsed, Err(ApiError::InvalidRequest(_))),
                "{params}"
            );
        }
    }
}
