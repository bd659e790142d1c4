//! Raw SQL that runs as a cached prepared statement.
//!
//! `diesel::sql_query` never caches: PostgreSQL parses and plans such a
//! statement on every execution. The hot paths here are raw SQL (CTEs and
//! conditional updates diesel's DSL cannot express), so they use
//! [`prepared`] instead: the same `.bind::<SqlType, _>(value)` API, but the
//! statement is prepared once per pooled connection and then only bound and
//! executed, like `pgbench -M prepared` does with the same SQL.
//!
//! Placeholders are `$1`, `$2`, … naming the binds in the order they were
//! given; a placeholder may repeat. The SQL must not contain a `$` followed
//! by digits anywhere else (no dollar-quoted strings).
//!
//! diesel finds a connection's prepared statement by its SQL text, which it
//! writes out and hashes at every execution; a statement of the hot path
//! names a type of its own instead ([`StaticSql`], [`prepared_static`]),
//! and is found by that type.

use std::borrow::Cow;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::Error as DieselError;
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};
use diesel::{QueryResult, RunQueryDsl};

/// One bind value with its SQL type.
trait Bind {
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()>;
}

struct Typed<ST, U> {
    value: U,
    sql_type: PhantomData<fn() -> ST>,
}

impl<ST, U> Bind for Typed<ST, U>
where
    Pg: HasSqlType<ST>,
    U: ToSql<ST, Pg>,
{
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_bind_param::<ST, U>(&self.value)
    }
}

/// A statement's text as a type of its own: diesel's statement cache finds
/// it by the type (`QueryId`), without writing the text out. One type,
/// one text, so a type can never find another statement.
pub trait StaticSql: 'static {
    const SQL: &'static str;
}

/// How diesel's statement cache finds a [`PreparedSql`]: by its text
/// ([`ByText`]), or by its [`StaticSql`] type.
pub trait CacheKey: 'static {
    const STATIC: bool;
}

/// A statement found by its text.
pub struct ByText;

impl CacheKey for ByText {
    const STATIC: bool = false;
}

impl<K: StaticSql> CacheKey for K {
    const STATIC: bool = true;
}

/// A raw SQL statement with binds, cached as a prepared statement.
#[must_use = "queries run only when loaded or executed"]
pub struct PreparedSql<'a, K: CacheKey = ByText> {
    sql: Cow<'static, str>,
    /// The SQL split into text and placeholders once (diesel walks a
    /// statement several times per execution: its cache key, its binds).
    spans: Arc<[Span]>,
    binds: Vec<Box<dyn Bind + 'a>>,
    key: PhantomData<fn() -> K>,
}

/// A piece of `PreparedSql::sql` by position: a byte range of text, or
/// placeholder `$n` (1-based).
enum Span {
    Text(std::ops::Range<usize>),
    Placeholder(usize),
}

/// Starts a cached raw statement (see the module documentation).
pub fn prepared<'a>(sql: impl Into<Cow<'static, str>>) -> PreparedSql<'a> {
    start(sql.into())
}

/// Starts the cached statement `K::SQL`, found in the cache by `K`.
pub fn prepared_static<'a, K: StaticSql>() -> PreparedSql<'a, K> {
    start(Cow::Borrowed(K::SQL))
}

fn start<'a, K: CacheKey>(sql: Cow<'static, str>) -> PreparedSql<'a, K> {
    let spans = match &sql {
        // A constant's spans are split once per process.
        Cow::Borrowed(text) => constant_spans(text),
        Cow::Owned(text) => Arc::from(spans(text)),
    };
    let placeholders = spans
        .iter()
        .map(|span| match span {
            Span::Placeholder(number) => *number,
            Span::Text(_) => 0,
        })
        .max()
        .unwrap_or(0);
    PreparedSql {
        sql,
        spans,
        binds: Vec::with_capacity(placeholders),
        key: PhantomData,
    }
}

/// `sql`'s pieces by position.
fn spans(sql: &str) -> Vec<Span> {
    let base = sql.as_ptr() as usize;
    pieces(sql)
        .into_iter()
        .map(|piece| match piece {
            Piece::Text(text) => {
                let start = text.as_ptr() as usize - base;
                Span::Text(start..start + text.len())
            }
            Piece::Placeholder(number) => Span::Placeholder(number),
        })
        .collect()
}

/// The spans of a `'static` SQL text, split the first time it is used
/// (keyed by its address: the constants are few).
fn constant_spans(sql: &'static str) -> Arc<[Span]> {
    /// Spans by the text's (address, length).
    type Split = RwLock<HashMap<(usize, usize), Arc<[Span]>>>;
    static SPLIT: OnceLock<Split> = OnceLock::new();
    let split = SPLIT.get_or_init(RwLock::default);
    let key = (sql.as_ptr() as usize, sql.len());
    if let Some(spans) = split
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Arc::clone(spans);
    }
    Arc::clone(
        split
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_insert_with(|| Arc::from(spans(sql))),
    )
}

impl<'a, K: CacheKey> PreparedSql<'a, K> {
    /// Binds the next placeholder (`$1` first).
    pub fn bind<ST, U>(mut self, value: U) -> Self
    where
        Pg: HasSqlType<ST>,
        U: ToSql<ST, Pg> + 'a,
        ST: 'a,
    {
        self.binds.push(Box::new(Typed {
            value,
            sql_type: PhantomData,
        }));
        self
    }
}

/// A piece of SQL text: literal text, or placeholder `$n` (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'s> {
    Text(&'s str),
    Placeholder(usize),
}

/// Splits SQL into text and `$n` placeholders, in order.
pub fn pieces(sql: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut rest = sql;
    let mut text_start = 0;
    let mut offset = 0;
    while let Some(at) = rest.find('$') {
        let digits = rest[at + 1..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        if digits > 0 {
            pieces.push(Piece::Text(&sql[text_start..offset + at]));
            // At most a few dozen placeholders: the digits always parse.
            let number = rest[at + 1..at + 1 + digits].parse().unwrap_or(0);
            pieces.push(Piece::Placeholder(number));
            text_start = offset + at + 1 + digits;
        }
        offset += at + 1 + digits;
        rest = &sql[offset..];
    }
    pieces.push(Piece::Text(&sql[text_start..]));
    pieces
}

/// The SQL with each placeholder replaced by `replacement(n)` (used to
/// write the pgbench twin of a statement).
pub fn substitute(sql: &str, mut replacement: impl FnMut(usize) -> String) -> String {
    pieces(sql)
        .into_iter()
        .map(|piece| match piece {
            Piece::Text(text) => text.to_owned(),
            Piece::Placeholder(number) => replacement(number),
        })
        .collect()
}

impl<K: CacheKey> QueryFragment<Pg> for PreparedSql<'_, K> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        // Each `$n` becomes the query builder's own placeholder for bind n,
        // so a repeated placeholder binds its value again.
        for span in self.spans.iter() {
            match span {
                Span::Text(range) => out.push_sql(&self.sql[range.clone()]),
                Span::Placeholder(number) => {
                    let number = *number;
                    let bind = number
                        .checked_sub(1)
                        .and_then(|index| self.binds.get(index))
                        .ok_or_else(|| {
                            DieselError::QueryBuilderError(
                                format!("placeholder ${number} has no bind value").into(),
                            )
                        })?;
                    bind.push(&mut out)?;
                }
            }
        }
        Ok(())
    }

    // The text is fixed and nothing in it depends on the binds' values:
    // always safe to cache (diesel would walk the statement to ask).
    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> QueryResult<bool> {
        Ok(true)
    }
}

impl<K: CacheKey> QueryId for PreparedSql<'_, K> {
    // ByText: not static, diesel's statement cache keys it by its SQL text;
    // a StaticSql type: by that type.
    type QueryId = K;
    const HAS_STATIC_QUERY_ID: bool = K::STATIC;
}

impl<K: CacheKey> Query for PreparedSql<'_, K> {
    type SqlType = Untyped;
}

impl<Conn, K: CacheKey> RunQueryDsl<Conn> for PreparedSql<'_, K> {}

#[cfg(test)]
mod tests {
    use super::prepared;
    use diesel::debug_query;
    use diesel::pg::Pg;
    use diesel::sql_types::{BigInt, Text};

    #[test]
    fn placeholders_become_binds_in_order_and_may_repeat() {
        let query = prepared("SELECT $2, $1 + $1, '$' || $2")
            .bind::<BigInt, _>(7_i64)
            .bind::<Text, _>("x");
        let text = debug_query::<Pg, _>(&query).to_string();
        assert!(
            text.starts_with("SELECT $1, $2 + $3, '$' || $4 -- binds: [\"x\", 7, 7, \"x\"]"),
            "{text}"
        );
    }

    #[test]
    fn a_constant_and_the_same_text_built_at_run_time_bind_alike() {
        const SQL: &str = "SELECT $2, $1 + $1, '$' || $2";
        let built = || {
            prepared(String::from(SQL))
                .bind::<BigInt, _>(7_i64)
                .bind::<Text, _>("x")
        };
        let constant = || prepared(SQL).bind::<BigInt, _>(7_i64).bind::<Text, _>("x");
        // The constant twice: the second use reads the spans split by the first.
        for _ in 0..2 {
            assert_eq!(
                debug_query::<Pg, _>(&constant()).to_string(),
                debug_query::<Pg, _>(&built()).to_string()
            );
        }
    }

    #[test]
    fn a_static_statement_binds_as_its_text_and_is_found_by_its_type() {
        use diesel::query_builder::QueryId;
        struct Two;
        impl super::StaticSql for Two {
            const SQL: &'static str = "SELECT $2, $1 + $1, '$' || $2";
        }
        struct Other;
        impl super::StaticSql for Other {
            const SQL: &'static str = "SELECT $1";
        }
        let by_type = super::prepared_static::<Two>()
            .bind::<BigInt, _>(7_i64)
            .bind::<Text, _>("x");
        let by_text = prepared(<Two as super::StaticSql>::SQL)
            .bind::<BigInt, _>(7_i64)
            .bind::<Text, _>("x");
        assert_eq!(
            debug_query::<Pg, _>(&by_type).to_string(),
            debug_query::<Pg, _>(&by_text).to_string()
        );
        fn id<Q: QueryId>(_: &Q) -> Option<std::any::TypeId> {
            Q::query_id()
        }
        assert_eq!(id(&by_text), None, "by text: diesel writes the text out");
        assert_eq!(id(&by_type), Some(std::any::TypeId::of::<Two>()));
        assert_ne!(id(&by_type), id(&super::prepared_static::<Other>()));
    }

    #[test]
    fn substitutes_placeholders_but_not_other_dollars() {
        let sql = "SELECT $10, $1, '$x', $2$1";
        let text = super::substitute(sql, |n| format!("<{n}>"));
        assert_eq!(text, "SELECT <10>, <1>, '$x', <2><1>");
    }

    #[test]
    fn a_placeholder_without_a_bind_is_an_error() {
        let query = prepared("SELECT $1, $2").bind::<BigInt, _>(1_i64);
        let mut text = String::new();
        let result = std::fmt::write(&mut text, format_args!("{}", debug_query::<Pg, _>(&query)));
        assert!(result.is_err(), "{text}");
    }
}
