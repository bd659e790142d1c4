//! Cursor paging of the list endpoints: the page size a client may ask
//! for, and the cut of a page fetched one row long.

use crate::error::ApiError;

/// A page size given by a client: `default` when absent, else 1 to `max`.
pub fn page_limit(limit: Option<i64>, default: i64, max: i64) -> Result<i64, ApiError> {
    let limit = limit.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::InvalidRequest(format!(
            "limit must be between 1 and {max}, got {limit}"
        )))
    }
}

/// Rows fetched with `LIMIT limit + 1`: the page (at most `limit` rows)
/// and, when there were more, the cursor of its last row (`next_after`).
pub fn page_of<T, C>(
    mut rows: Vec<T>,
    limit: i64,
    cursor: impl Fn(&T) -> C,
) -> (Vec<T>, Option<C>) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next_after = if more { rows.last().map(cursor) } else { None };
    (rows, next_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_default_and_bound() {
        assert_eq!(page_limit(None, 100, 1_000).expect("default"), 100);
        assert_eq!(page_limit(Some(1_000), 100, 1_000).expect("max"), 1_000);
        assert!(page_limit(Some(0), 100, 1_000).is_err());
        assert!(page_limit(Some(1_001), 100, 1_000).is_err());
    }

    #[test]
    fn a_page_one_row_long_has_a_cursor() {
        assert_eq!(
            page_of(vec![1, 2, 3], 2, |n| *n * 10),
            (vec![1, 2], Some(20))
        );
        assert_eq!(page_of(vec![1, 2], 2, |n| *n * 10), (vec![1, 2], None));
        assert_eq!(page_of(Vec::<i32>::new(), 2, |n| *n), (vec![], None));
    }
}
