//! Instants and dates, read one way and written one way everywhere.
//!
//! Read: [`parse_instant`] takes RFC 3339 or a bare date (`YYYY-MM-DD`,
//! its midnight UTC) and [`parse_date`] a bare date; the API (`as_of`,
//! `from`, `to`, a credit's `expires_at`), the CLI (`reconcile`,
//! `balances`, `ledger-digest --until`) and the console (which sends what
//! was typed) all go through them, so a value means the same wherever it is
//! typed and a mistake reads the same ([`INSTANT_EXPECTED`]).
//!
//! Written: RFC 3339 in UTC with `Z` and always six fractional digits
//! (PostgreSQL's resolution): [`rfc3339`], and the serde helpers
//! [`micros`] / [`micros_option`] on every time field of the API. The
//! engine writes the same in SQL (`engine_time`, src/engine/sql/05_views.sql)
//! for what the events carry.

use chrono::{DateTime, NaiveDate, NaiveTime, SecondsFormat, Utc};

/// What an instant may be, said the same way by every reader.
pub const INSTANT_EXPECTED: &str = "an RFC 3339 timestamp (e.g. 2026-11-30T23:59:59Z or \
     2026-11-30T23:59:59+01:00) or a date (YYYY-MM-DD, its midnight UTC)";

/// What a date may be.
pub const DATE_EXPECTED: &str = "a date (YYYY-MM-DD)";

/// An instant as the API and the events write it.
pub fn rfc3339(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A bare date, `YYYY-MM-DD` exactly.
pub fn parse_date(text: &str) -> Option<NaiveDate> {
    if text.len() != 10 {
        return None;
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()
}

/// An instant: RFC 3339 (any offset, `T`, `t` or a space between date and
/// time) or a bare date as its midnight UTC. A `+` of an offset that
/// arrived unencoded in a query string reads as a space; it is taken back
/// as the `+` it must have been. `None` when it is neither.
pub fn parse_instant(text: &str) -> Option<DateTime<Utc>> {
    if let Some(date) = parse_date(text) {
        return Some(date.and_time(NaiveTime::MIN).and_utc());
    }
    let repaired = match text.rsplit_once(' ') {
        Some((instant, offset)) if offset.len() == 5 && offset.as_bytes()[2] == b':' => {
            format!("{instant}+{offset}")
        }
        _ => text.to_owned(),
    };
    DateTime::parse_from_rfc3339(&repaired)
        .ok()
        .map(|instant| instant.with_timezone(&Utc))
}

/// [`parse_instant`] with the one error message: `{what} must be …, not "…"`.
pub fn instant_of(what: &str, text: &str) -> Result<DateTime<Utc>, String> {
    parse_instant(text).ok_or_else(|| instant_error(what, text))
}

/// The one message of an instant that could not be read.
pub fn instant_error(what: &str, text: &str) -> String {
    format!("{what} must be {INSTANT_EXPECTED}, not {text:?}")
}

/// [`parse_date`] with its message.
pub fn date_of(what: &str, text: &str) -> Result<NaiveDate, String> {
    parse_date(text).ok_or_else(|| format!("{what} must be {DATE_EXPECTED}, not {text:?}"))
}

/// A measured duration in milliseconds, to the microsecond: a measurement
/// is not more exact than its clock, and `1.0503339999999999` is noise.
pub fn round_milliseconds(milliseconds: f64) -> f64 {
    (milliseconds * 1_000.0).round() / 1_000.0
}

/// `#[serde(serialize_with = "crate::time::milliseconds")]`: a duration in
/// milliseconds written by [`round_milliseconds`] (rows recorded before it
/// rounded them included).
pub fn milliseconds<S: serde::Serializer>(milliseconds: &f64, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_f64(round_milliseconds(*milliseconds))
}

/// `#[serde(with = "crate::time::micros")]`: written by [`rfc3339`], read
/// by [`parse_instant`].
pub mod micros {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(instant: &DateTime<Utc>, out: S) -> Result<S::Ok, S::Error> {
        out.serialize_str(&super::rfc3339(*instant))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<DateTime<Utc>, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(input)?;
        super::parse_instant(&text)
            .ok_or_else(|| serde::de::Error::custom(super::instant_error("a time", &text)))
    }
}

/// The same, of an optional time (null when absent).
pub mod micros_option {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        instant: &Option<DateTime<Utc>>,
        out: S,
    ) -> Result<S::Ok, S::Error> {
        match instant {
            Some(instant) => out.serialize_str(&super::rfc3339(*instant)),
            None => out.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        input: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        match Option::<std::borrow::Cow<str>>::deserialize(input)? {
            None => Ok(None),
            Some(text) => super::parse_instant(&text)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(super::instant_error("a time", &text))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_rfc3339_or_a_date_at_midnight_utc() {
        let at = |text: &str| text.parse::<DateTime<Utc>>().expect("time");
        assert_eq!(
            parse_instant("2026-12-01"),
            Some(at("2026-12-01T00:00:00Z"))
        );
        assert_eq!(
            parse_instant("2026-12-01T01:00:00+01:00"),
            Some(at("2026-12-01T00:00:00Z"))
        );
        assert_eq!(
            parse_instant("2026-12-01T00:00:00 01:00"),
            Some(at("2026-11-30T23:00:00Z"))
        );
        for bad in [
            "2026-12-1",
            "2026-13-01",
            "2026-11",
            "01.11.2026",
            "2026-11-01 junk",
            "yesterday",
            "",
            "2026-12-01T00:00",
        ] {
            assert_eq!(parse_instant(bad), None, "{bad}");
        }
        assert_eq!(
            instant_of("until", "soon").expect_err("refused"),
            format!("until must be {INSTANT_EXPECTED}, not \"soon\"")
        );
    }

    #[test]
    fn milliseconds_are_rounded_to_the_microsecond() {
        assert_eq!(round_milliseconds(1.0503339999999999), 1.05);
        assert_eq!(
            serde_json::to_string(&round_milliseconds(12.3456789)).expect("json"),
            "12.346"
        );
    }

    #[test]
    fn instants_are_written_in_z_with_microseconds() {
        let at = "2027-01-01T00:00:00Z"
            .parse::<DateTime<Utc>>()
            .expect("time");
        assert_eq!(rfc3339(at), "2027-01-01T00:00:00.000000Z");
    }
}
