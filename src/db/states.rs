//! The states of the domain as Rust enums, end to end: a reservation's
//! state, a job's status, an account's status. Each has exactly one mapping
//! to its database text (`as_str` / `parse`), used by diesel (the columns
//! are `text` with `CHECK`s), by serde (the API and the engine's JSON) and
//! by metrics labels.

use std::fmt;

use diesel::deserialize::{self, FromSql};
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::Text;

macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$variant_meta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash,
                 serde::Serialize, serde::Deserialize,
                 diesel::expression::AsExpression, diesel::deserialize::FromSqlRow)]
        #[diesel(sql_type = Text)]
        #[serde(into = "&'static str", try_from = "String")]
        pub enum $name {
            $($(#[$variant_meta])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The database (and API) text.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            pub fn parse(text: &str) -> Option<$name> {
                match text {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str(self.as_str())
            }
        }

        impl From<$name> for &'static str {
            fn from(value: $name) -> &'static str {
                value.as_str()
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(text: String) -> Result<$name, String> {
                $name::parse(&text).ok_or_else(|| {
                    format!("{text:?} is not a {}", stringify!($name))
                })
            }
        }

        impl ToSql<Text, Pg> for $name {
            fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
                <str as ToSql<Text, Pg>>::to_sql(self.as_str(), &mut out.reborrow())
            }
        }

        impl FromSql<Text, Pg> for $name {
            fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<$name> {
                let text = <String as FromSql<Text, Pg>>::from_sql(bytes)?;
                Ok($name::try_from(text)?)
            }
        }
    };
}

text_enum! {
    /// Where a reservation's tokens are: `held` until exactly one of
    /// commit, release or expiry moves it.
    ReservationState {
        Held => "held",
        Committed => "committed",
        Released => "released",
        Expired => "expired",
    }
}

text_enum! {
    /// A generation job's status.
    JobStatus {
        Queued => "queued",
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
    }
}

impl JobStatus {
    pub const TERMINAL: [JobStatus; 2] = [JobStatus::Succeeded, JobStatus::Failed];

    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed)
    }
}

/// Parses an API parameter into a state, with an error that lists the
/// accepted values.
pub fn parse_param<T: Copy + Into<&'static str>>(
    name: &str,
    text: &str,
    all: &[T],
    parse: fn(&str) -> Option<T>,
) -> Result<T, crate::error::ApiError> {
    parse(text).ok_or_else(|| {
        let accepted: Vec<&str> = all.iter().map(|value| (*value).into()).collect();
        crate::error::ApiError::InvalidRequest(format!(
            "{name} must be one of {}, got {text:?}",
            accepted.join(", ")
        ))
    })
}

text_enum! {
    /// A credit grant's status (the engine's `engine_grant_status` decides
    /// which one a grant is in).
    GrantStatus {
        /// Not lapsed, and still holds tokens: remaining or reserved.
        Active => "active",
        /// Its expiry has passed.
        Expired => "expired",
        /// Not lapsed; every token consumed or taken by a removal.
        Depleted => "depleted",
    }
}

text_enum! {
    /// Whether an account may spend.
    AccountStatus {
        Active => "active",
        Suspended => "suspended",
    }
}

text_enum! {
    /// What an event reports (docs/webhooks.md).
    EventType {
        BalanceLow => "account.balance_low",
        BalanceRecovered => "account.balance_recovered",
        BalanceDepleted => "account.balance_depleted",
        CreditCreated => "credit.created",
        AdjustmentCreated => "adjustment.created",
        ReservationExpired => "reservation.expired",
        GrantExpired => "grant.expired",
        GrantExpiring => "grant.expiring",
        GrantRolledOver => "grant.rolled_over",
        TopupGranted => "topup.granted",
        TopupRequested => "topup.requested",
        TopupRequestExpired => "topup.request_expired",
        TopupCapReached => "topup.cap_reached",
        JobSucceeded => "job.succeeded",
        JobFailed => "job.failed",
        InvariantViolated => "invariant.violated",
        EndpointDisabled => "endpoint.disabled",
        KeyBudgetLow => "key.budget_low",
        KeyBudgetExhausted => "key.budget_exhausted",
    }
}

/// In the OpenAPI document: a string, one of the types.
impl utoipa::PartialSchema for EventType {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(EventType::ALL.iter().map(|value| value.as_str())))
            .into()
    }
}

impl utoipa::ToSchema for EventType {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_through_serde_and_parse() {
        for state in ReservationState::ALL {
            let json = serde_json::to_value(state).expect("serialize");
            assert_eq!(json, serde_json::json!(state.as_str()));
            let back: ReservationState = serde_json::from_value(json).expect("deserialize");
            assert_eq!(back, *state);
        }
        for status in JobStatus::ALL {
            assert_eq!(JobStatus::parse(status.as_str()), Some(*status));
        }
        assert!(serde_json::from_value::<AccountStatus>(serde_json::json!("closed")).is_err());
    }
}
