//! Generation jobs: the validated request (the money engine creates the
//! job with its reservation, `engine_create_job`) and the reads. The
//! worker's fenced transitions live in `domain::job_leases`.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::db::schema::generation_jobs;
use crate::db::states::JobStatus;
use crate::domain::paging::page_of;
pub use crate::engine::jobs::{JobRequest, JobReservation, JobView};
use crate::engine::types::{AccountId, RequestId};
use crate::error::ApiError;

/// Jobs as the engine shows them (`engine_job_json`, the representation
/// the job events carry too): an account's, one by request id or a page
/// newest first.
fn shown_jobs(
    conn: &mut PgConnection,
    account: AccountId,
    request_id: Option<RequestId>,
    status: Option<JobStatus>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<JobView>, ApiError> {
    #[derive(QueryableByName)]
    struct Shown {
        #[diesel(sql_type = Jsonb)]
        job: serde_json::Value,
    }
    let shown: Vec<Shown> = diesel::sql_query(
        "SELECT engine_job_json(j) AS job FROM generation_jobs j \
         WHERE j.account_id = $1 AND ($2::uuid IS NULL OR j.request_id = $2) \
           AND ($3::text IS NULL OR j.status = $3) AND ($4::uuid IS NULL OR j.id < $4) \
         ORDER BY j.id DESC LIMIT $5",
    )
    .bind::<SqlUuid, _>(account.0)
    .bind::<Nullable<SqlUuid>, _>(request_id.map(|id| id.0))
    .bind::<Nullable<Text>, _>(status.map(JobStatus::as_str))
    .bind::<Nullable<SqlUuid>, _>(after)
    .bind::<BigInt, _>(limit)
    .load(conn)?;
    shown
        .into_iter()
        .map(|shown| crate::engine::decode::<JobView>(shown.job, "a job as the engine shows it"))
        .collect()
}

pub fn get_job(
    conn: &mut PgConnection,
    account: AccountId,
    request_id: RequestId,
) -> Result<JobView, ApiError> {
    shown_jobs(conn, account, Some(request_id), None, None, 1)?
        .pop()
        .ok_or(ApiError::NotFound("job"))
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
    let shown = shown_jobs(conn, account, None, status, after, limit + 1)?;
    let (jobs, next_after) = page_of(shown, limit, |job: &JobView| job.job_id);
    Ok(JobPage { jobs, next_after })
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
