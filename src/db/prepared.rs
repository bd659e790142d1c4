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

use std::borrow::Cow;
use std::marker::PhantomData;

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

/// A raw SQL statement with binds, cached as a prepared statement.
#[must_use = "queries run only when loaded or executed"]
pub struct PreparedSql<'a> {
    sql: Cow<'static, str>,
    binds: Vec<Box<dyn Bind + 'a>>,
}

/// Starts a cached raw statement (see the module documentation).
pub fn prepared<'a>(sql: impl Into<Cow<'static, str>>) -> PreparedSql<'a> {
    PreparedSql {
        sql: sql.into(),
        binds: Vec::new(),
    }
}

impl<'a> PreparedSql<'a> {
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

impl QueryFragment<Pg> for PreparedSql<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        // Each `$n` becomes the query builder's own placeholder for bind n,
        // so a repeated placeholder binds its value again.
        for piece in pieces(&self.sql) {
            match piece {
                Piece::Text(text) => out.push_sql(text),
                Piece::Placeholder(number) => {
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
}

impl QueryId for PreparedSql<'_> {
    // Not static: diesel's statement cache keys it by its SQL text.
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for PreparedSql<'_> {
    type SqlType = Untyped;
}

impl<Conn> RunQueryDsl<Conn> for PreparedSql<'_> {}

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
