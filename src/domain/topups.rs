//! Automatic top-up rules (docs/topups.md): their validation and their
//! storage. What a rule does — when it fires, how much, exactly once — is
//! the money engine's (`src/engine/sql/80_topups.sql`); every change of a
//! rule is judged by it at once (`engine_topup_rule_changed`) under the
//! account's row lock, and audited in the same transaction.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Integer, Jsonb, Nullable, SmallInt, Text, Uuid as SqlUuid};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::config::AMOUNT_MAX;
use crate::domain::audit::{self, Audit};
use crate::engine::types::{AccountId, Currency, MinorUnits, Price};
use crate::error::ApiError;

/// Live rules an account may have (threshold: at most one).
pub const RULES_PER_ACCOUNT_MAX: i64 = 20;
/// A cap or threshold at most (a whole month of tokens).
pub const RULE_TOKENS_MAX: i64 = 1_000_000_000;
/// `request_ttl` when a request rule names none.
pub const REQUEST_TTL_DEFAULT_SECONDS: i64 = 86_400;
const REQUEST_TTL_MIN_SECONDS: i64 = 60;
const REQUEST_TTL_MAX_SECONDS: i64 = 30 * 86_400;
const EXPIRES_AFTER_MIN_SECONDS: i64 = 60;
const EXPIRES_AFTER_MAX_SECONDS: i64 = 3650 * 86_400;
/// A new rule that names no cap may add at most this many firings' worth
/// of tokens a day (`tokens`, or `target_tokens` for method target): ten
/// refills cover a busy event day, and a rule gone wrong stops after ten
/// card charges rather than none.
pub const DEFAULT_DAILY_CAP_FIRINGS: i64 = 10;

/// What makes a rule fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// When `available` (plus the tokens of the rule's open request) falls
    /// below `threshold_tokens`: once per crossing.
    Threshold,
    /// Once per `period`.
    Schedule,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Daily,
    /// From `anchor_day` (1 = Monday … 7 = Sunday).
    Weekly,
    /// From day `anchor_day` (1 … 28) of the month.
    Monthly,
}

/// How much a firing adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// `tokens`.
    Fixed,
    /// What brings `available` up to `target_tokens` (nothing when it is
    /// there already).
    Target,
}

/// Who adds the tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The service credits at once (a prepaid agreement).
    Grant,
    /// The service sends `topup.requested` and waits for the customer's
    /// billing to credit with `external_ref` = the request's `firing_id`.
    Request,
}

/// A schedule rule's rollover: at the end of each period, what its grant
/// did not use (up to `max_tokens`) moves into a new grant (docs/topups.md,
/// "Rollover").
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rollover {
    /// Tokens carried forward at most (1 … 1,000,000,000).
    pub max_tokens: i64,
    /// The carried grant lapses this long after the lapse that made it (ISO
    /// 8601 duration, `PT1M` … `P3650D`); none: never. A carried grant is
    /// never carried again.
    pub expires_after: Option<String>,
}

/// A rule as the API takes it (POST), and as a PATCH leaves it (the rule's
/// fields with the PATCH's members laid over them).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TopupRuleBody {
    pub trigger: Trigger,
    /// `threshold` only: the line `available` must stay at or above
    /// (1 … 1,000,000,000).
    pub threshold_tokens: Option<i64>,
    /// `schedule` only.
    pub period: Option<Period>,
    /// `weekly`: 1 (Monday) … 7; `monthly`: 1 … 28; `daily`: none.
    pub anchor_day: Option<i64>,
    /// The periods' and caps' time zone, an IANA name (`Europe/Berlin`);
    /// default `UTC`.
    pub time_zone: Option<String>,
    pub method: Method,
    /// `fixed` only: tokens per firing (1 … 1,000,000).
    pub tokens: Option<i64>,
    /// `target` only: the balance a firing brings `available` up to
    /// (1 … 1,000,000).
    pub target_tokens: Option<i64>,
    /// Default `grant`.
    pub mode: Option<Mode>,
    /// `request` only: how long a request waits for the customer's credit
    /// (ISO 8601 duration, `PT1M` … `P30D`, default `P1D`).
    pub request_ttl: Option<String>,
    /// The grant's priority, 0 … 100 (default 50; lower is drawn first).
    pub priority: Option<i64>,
    /// The grant lapses this long after it is made (ISO 8601 duration,
    /// `PT1M` … `P3650D`); none: never.
    pub expires_after: Option<String>,
    /// `schedule` only: the grant lapses at the end of the period it is for
    /// (this month's allowance lapses at the month's end).
    pub expires_at_period_end: Option<bool>,
    /// `schedule`, mode `grant`, with `expires_after` or
    /// `expires_at_period_end` only: when a grant of the rule lapses, its
    /// unused tokens up to `max_tokens` carry into a new grant.
    pub rollover: Option<Rollover>,
    /// Tokens the rule may add per day (in `time_zone`); over it, the rule
    /// sends `topup.cap_reached` once instead.
    pub max_tokens_per_day: Option<i64>,
    /// The same per month.
    pub max_tokens_per_month: Option<i64>,
    /// Method `fixed`, mode `grant` only: what each grant the rule makes
    /// was paid, in minor units of `currency` (its `tokens` for this
    /// price; docs/finance.md). With `currency`, or neither: unpriced.
    pub amount_paid: Option<MinorUnits>,
    /// ISO 4217 code of `amount_paid`.
    pub currency: Option<Currency>,
    /// A rule that names neither cap gets `max_tokens_per_day` of ten
    /// firings' worth; `true` keeps it without any cap instead. A change
    /// that removes a rule's last cap needs it too.
    pub allow_uncapped: Option<bool>,
    /// Default true. A disabled rule never fires.
    pub enabled: Option<bool>,
}

/// A validated rule, as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleSpec {
    pub trigger: Trigger,
    pub threshold_tokens: Option<i64>,
    pub period: Option<Period>,
    pub anchor_day: Option<i16>,
    pub time_zone: String,
    pub method: Method,
    pub tokens: Option<i64>,
    pub target_tokens: Option<i64>,
    pub mode: Mode,
    pub request_ttl_seconds: Option<i32>,
    pub priority: i16,
    pub expires_after_seconds: Option<i64>,
    pub expires_at_period_end: bool,
    /// `rollover.max_tokens` and `rollover.expires_after` in seconds.
    pub rollover: Option<(i64, Option<i64>)>,
    pub max_tokens_per_day: Option<i64>,
    pub max_tokens_per_month: Option<i64>,
    pub price: Option<Price>,
    pub enabled: bool,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::InvalidRequest(message.into())
}

fn within(name: &str, value: i64, max: i64) -> Result<i64, ApiError> {
    if (1..=max).contains(&value) {
        Ok(value)
    } else {
        Err(bad(format!(
            "{name} must be between 1 and {max}, got {value}"
        )))
    }
}

/// An ISO 8601 duration of weeks, days, hours, minutes and seconds
/// (`P30D`, `PT2H`, `P1W`, `P1DT12H`), in seconds. Years and months are
/// refused: their length depends on the calendar.
pub fn parse_duration(name: &str, text: &str) -> Result<i64, ApiError> {
    let refuse = || {
        bad(format!(
            "{name} must be an ISO 8601 duration of weeks, days, hours, minutes or seconds \
             (for example P30D, PT2H, P1DT12H), got {text:?}"
        ))
    };
    let rest = text.strip_prefix('P').ok_or_else(refuse)?;
    let (date, time) = match rest.split_once('T') {
        Some((date, time)) if !time.is_empty() => (date, Some(time)),
        Some(_) => return Err(refuse()),
        None => (rest, None),
    };
    if date.is_empty() && time.is_none() {
        return Err(refuse());
    }
    let mut seconds: i64 = 0;
    let mut add = |part: &str, units: &[(char, i64)]| -> Result<(), ApiError> {
        let mut number = String::new();
        let mut next_unit = 0;
        for character in part.chars() {
            if character.is_ascii_digit() {
                number.push(character);
                continue;
            }
            let position = units[next_unit..]
                .iter()
                .position(|(unit, _)| *unit == character)
                .ok_or_else(refuse)?;
            let (_, size) = units[next_unit + position];
            next_unit += position + 1;
            let value: i64 = number.parse().map_err(|_| refuse())?;
            number.clear();
            seconds = value
                .checked_mul(size)
                .and_then(|part| seconds.checked_add(part))
                .ok_or_else(refuse)?;
        }
        if number.is_empty() {
            Ok(())
        } else {
            Err(refuse())
        }
    };
    add(date, &[('W', 7 * 86_400), ('D', 86_400)])?;
    if let Some(time) = time {
        add(time, &[('H', 3_600), ('M', 60), ('S', 1)])?;
    }
    Ok(seconds)
}

impl TryFrom<TopupRuleBody> for RuleSpec {
    type Error = ApiError;

    fn try_from(body: TopupRuleBody) -> Result<RuleSpec, ApiError> {
        let threshold = body.trigger == Trigger::Threshold;
        let threshold_tokens = match (threshold, body.threshold_tokens) {
            (true, Some(tokens)) => Some(within("threshold_tokens", tokens, RULE_TOKENS_MAX)?),
            (true, None) => return Err(bad("a threshold rule needs threshold_tokens")),
            (false, Some(_)) => {
                return Err(bad("threshold_tokens applies to a threshold rule only"))
            }
            (false, None) => None,
        };
        let period = match (threshold, body.period) {
            (false, Some(period)) => Some(period),
            (false, None) => {
                return Err(bad(
                    "a schedule rule needs period (daily, weekly or monthly)",
                ))
            }
            (true, Some(_)) => return Err(bad("period applies to a schedule rule only")),
            (true, None) => None,
        };
        let anchor_day = match (period, body.anchor_day) {
            (Some(Period::Weekly), Some(day)) if (1..=7).contains(&day) => Some(day),
            (Some(Period::Weekly), _) => {
                return Err(bad(
                    "a weekly rule needs anchor_day, the day its week starts: 1 (Monday) … 7 \
                     (Sunday)",
                ))
            }
            (Some(Period::Monthly), Some(day)) if (1..=28).contains(&day) => Some(day),
            (Some(Period::Monthly), _) => {
                return Err(bad(
                    "a monthly rule needs anchor_day, the day of the month its period starts: \
                     1 … 28",
                ))
            }
            (_, Some(_)) => return Err(bad("anchor_day applies to a weekly or monthly rule only")),
            (_, None) => None,
        };
        let time_zone = body.time_zone.unwrap_or_else(|| "UTC".to_owned());
        if time_zone.is_empty() || time_zone.len() > 64 {
            return Err(bad(
                "time_zone must be an IANA time zone name such as Europe/Berlin",
            ));
        }
        let (tokens, target_tokens) = match body.method {
            Method::Fixed => {
                if body.target_tokens.is_some() {
                    return Err(bad("target_tokens applies to method target only"));
                }
                let tokens = body
                    .tokens
                    .ok_or_else(|| bad("method fixed needs tokens, the tokens per firing"))?;
                (Some(within("tokens", tokens, AMOUNT_MAX)?), None)
            }
            Method::Target => {
                if body.tokens.is_some() {
                    return Err(bad("tokens applies to method fixed only"));
                }
                let target = body.target_tokens.ok_or_else(|| {
                    bad("method target needs target_tokens, the balance to top up to")
                })?;
                (None, Some(within("target_tokens", target, AMOUNT_MAX)?))
            }
        };
        let mode = body.mode.unwrap_or(Mode::Grant);
        let request_ttl_seconds = match (mode, body.request_ttl.as_deref()) {
            (Mode::Request, ttl) => {
                let seconds = match ttl {
                    Some(text) => parse_duration("request_ttl", text)?,
                    None => REQUEST_TTL_DEFAULT_SECONDS,
                };
                if !(REQUEST_TTL_MIN_SECONDS..=REQUEST_TTL_MAX_SECONDS).contains(&seconds) {
                    return Err(bad("request_ttl must be between PT1M and P30D"));
                }
                Some(i32::try_from(seconds).map_err(|_| bad("request_ttl is too long"))?)
            }
            (Mode::Grant, Some(_)) => return Err(bad("request_ttl applies to mode request only")),
            (Mode::Grant, None) => None,
        };
        if mode == Mode::Request
            && (body.priority.is_some()
                || body.expires_after.is_some()
                || body.expires_at_period_end == Some(true))
        {
            return Err(bad(
                "priority, expires_after and expires_at_period_end apply to mode grant only: in \
                 mode request the customer's credit names its own priority and expiry",
            ));
        }
        let priority = match body.priority {
            None => 50,
            Some(priority) => match i16::try_from(priority) {
                Ok(priority) if (0..=100).contains(&priority) => priority,
                _ => {
                    return Err(bad(format!(
                        "priority must be between 0 and 100, got {priority}"
                    )))
                }
            },
        };
        let expiry = |name: &str, text: Option<&str>| {
            text.map(|text| {
                let seconds = parse_duration(name, text)?;
                if (EXPIRES_AFTER_MIN_SECONDS..=EXPIRES_AFTER_MAX_SECONDS).contains(&seconds) {
                    Ok(seconds)
                } else {
                    Err(bad(format!("{name} must be between PT1M and P3650D")))
                }
            })
            .transpose()
        };
        let expires_after_seconds = expiry("expires_after", body.expires_after.as_deref())?;
        let price = Price::of(body.amount_paid, body.currency).map_err(bad)?;
        if price.is_some() && !(body.method == Method::Fixed && mode == Mode::Grant) {
            return Err(bad(
                "amount_paid and currency apply to a rule of method fixed and mode grant only: \
                 a request's grant is the customer's credit, which carries its own price",
            ));
        }
        let expires_at_period_end = body.expires_at_period_end.unwrap_or(false);
        if expires_at_period_end && threshold {
            return Err(bad("expires_at_period_end applies to a schedule rule only"));
        }
        if expires_at_period_end && expires_after_seconds.is_some() {
            return Err(bad("give expires_after or expires_at_period_end, not both"));
        }
        let rollover = match &body.rollover {
            None => None,
            Some(_) if threshold || mode != Mode::Grant => {
                return Err(bad(
                    "rollover applies to a schedule rule in mode grant only: it carries what \
                     the period's grant did not use",
                ))
            }
            Some(_) if !expires_at_period_end && expires_after_seconds.is_none() => {
                return Err(bad(
                    "rollover needs grants that lapse: give expires_at_period_end or \
                     expires_after",
                ))
            }
            Some(rollover) => Some((
                within("rollover.max_tokens", rollover.max_tokens, RULE_TOKENS_MAX)?,
                expiry("rollover.expires_after", rollover.expires_after.as_deref())?,
            )),
        };
        let cap = |name: &str, value: Option<i64>| {
            value
                .map(|value| within(name, value, RULE_TOKENS_MAX))
                .transpose()
        };
        let mut max_tokens_per_day = cap("max_tokens_per_day", body.max_tokens_per_day)?;
        let max_tokens_per_month = cap("max_tokens_per_month", body.max_tokens_per_month)?;
        if max_tokens_per_day.is_none()
            && max_tokens_per_month.is_none()
            && body.allow_uncapped != Some(true)
        {
            let firing = tokens.or(target_tokens).unwrap_or(0);
            max_tokens_per_day = Some(firing.saturating_mul(DEFAULT_DAILY_CAP_FIRINGS));
        }
        if let Some(tokens) = tokens {
            for (name, max) in [
                ("max_tokens_per_day", max_tokens_per_day),
                ("max_tokens_per_month", max_tokens_per_month),
            ] {
                if max.is_some_and(|max| max < tokens) {
                    return Err(bad(format!(
                        "{name} is below tokens ({tokens}): the rule could never fire"
                    )));
                }
            }
        }
        Ok(RuleSpec {
            trigger: body.trigger,
            threshold_tokens,
            period,
            anchor_day: anchor_day.map(|day| i16::try_from(day).unwrap_or(1)),
            time_zone,
            method: body.method,
            tokens,
            target_tokens,
            mode,
            request_ttl_seconds,
            priority,
            expires_after_seconds,
            expires_at_period_end,
            rollover,
            max_tokens_per_day,
            max_tokens_per_month,
            price,
            enabled: body.enabled.unwrap_or(true),
        })
    }
}

fn text_of<T: Serialize>(value: T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(text)) => text,
        _ => String::new(),
    }
}

/// A firing of a rule as the API and the events show it
/// (`engine_topup_firing_json`).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopupFiringView {
    /// The firing; a request's is the `external_ref` the customer's credit
    /// names.
    pub firing_id: Uuid,
    pub rule_id: Uuid,
    pub account_id: AccountId,
    /// `granted`, `requested`, `cap_reached`, or `skipped` (a schedule's
    /// period with nothing to add).
    #[schema(example = "granted")]
    pub outcome: String,
    /// Tokens granted or requested (cap_reached: what it would have added).
    pub tokens: i64,
    /// A schedule's firing: the start of its period.
    #[serde(with = "crate::time::micros_option")]
    pub period_start: Option<DateTime<Utc>>,
    /// cap_reached: `day:YYYY-MM-DD` or `month:YYYY-MM`.
    pub cap_period: Option<String>,
    /// A request's state: `open`, `fulfilled` or `expired`.
    pub state: Option<String>,
    /// A request's expiry.
    #[serde(with = "crate::time::micros_option")]
    pub expires_at: Option<DateTime<Utc>>,
    /// The credit that added the tokens (granted, or a fulfilled request).
    pub credit_id: Option<Uuid>,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::micros_option")]
    pub resolved_at: Option<DateTime<Utc>>,
}

/// What a rule is doing (`engine_topup_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleStatus {
    /// It never fires.
    Disabled,
    /// A schedule rule: once per period.
    Scheduled,
    /// Its request waits for the customer's credit.
    RequestOpen,
    /// It fires when `available` goes below its line (at the next movement
    /// if it already is).
    Armed,
    /// Below its line, but what it added is not used yet
    /// (`unconsumed_tokens`): it fires once that much is used (or credited
    /// otherwise than by the rule).
    WaitingForUse,
    /// Below its line and stopped by a cap until the balance is back at
    /// its line.
    CapReached,
    /// Below its line after a firing that did not lift it: it re-arms when
    /// the balance is back at its line.
    WaitingForBalance,
}

/// A rule as the API and the events show it (`engine_topup_rule_json`).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopupRuleView {
    pub rule_id: Uuid,
    pub account_id: AccountId,
    pub trigger: Trigger,
    pub threshold_tokens: Option<i64>,
    pub period: Option<Period>,
    pub anchor_day: Option<i16>,
    pub time_zone: String,
    pub method: Method,
    pub tokens: Option<i64>,
    pub target_tokens: Option<i64>,
    pub mode: Mode,
    /// ISO 8601 duration.
    pub request_ttl: Option<String>,
    /// The grant's priority (mode grant; null in mode request, whose
    /// customer's credit names its own).
    pub priority: Option<i16>,
    /// ISO 8601 duration.
    pub expires_after: Option<String>,
    pub expires_at_period_end: bool,
    /// What the rule's lapsing grants carry forward; null: nothing.
    pub rollover: Option<Rollover>,
    pub max_tokens_per_day: Option<i64>,
    pub max_tokens_per_month: Option<i64>,
    /// What each grant the rule makes was paid, in minor units of
    /// `currency`; null: its grants are unpriced.
    pub amount_paid: Option<i64>,
    /// ISO 4217 code of `amount_paid`.
    pub currency: Option<String>,
    pub enabled: bool,
    /// A threshold rule: whether it fires at the next crossing (it re-arms
    /// when `available`, plus its open request, is back at or above the
    /// threshold); null for a schedule.
    pub armed: Option<bool>,
    /// A threshold rule: the tokens it added (granted, or requested and
    /// not expired) that nothing has used since (commits, and credits that
    /// are not the rule's own, count as use). It fires only at 0: a rule
    /// never adds tokens that nothing used. Null for a schedule.
    pub unconsumed_tokens: Option<i64>,
    /// What the rule is doing now.
    pub status: RuleStatus,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::micros")]
    pub updated_at: DateTime<Utc>,
    /// Its last firing; null before the first.
    pub last_firing: Option<TopupFiringView>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TopupRulePage {
    pub rules: Vec<TopupRuleView>,
}

#[derive(QueryableByName)]
struct Shown {
    #[diesel(sql_type = Jsonb)]
    rule: Value,
}

fn decode(shown: Shown) -> Result<TopupRuleView, ApiError> {
    crate::engine::decode(shown.rule, "a top-up rule as the engine shows it")
}

/// The account's live rules, oldest first.
pub fn list_rules(conn: &mut PgConnection, account: AccountId) -> Result<TopupRulePage, ApiError> {
    crate::domain::accounts::get_account(conn, account)?;
    let shown: Vec<Shown> = diesel::sql_query(
        "SELECT engine_topup_rule_json(to_jsonb(r)) AS rule FROM topup_rules r \
         WHERE r.account_id = $1 AND r.deleted_at IS NULL ORDER BY r.created_at, r.id",
    )
    .bind::<SqlUuid, _>(account.0)
    .load(conn)?;
    let rules = shown.into_iter().map(decode).collect::<Result<_, _>>()?;
    Ok(TopupRulePage { rules })
}

/// One live rule of the account.
pub fn get_rule(
    conn: &mut PgConnection,
    account: AccountId,
    rule: Uuid,
) -> Result<TopupRuleView, ApiError> {
    let shown: Option<Shown> = diesel::sql_query(
        "SELECT engine_topup_rule_json(to_jsonb(r)) AS rule FROM topup_rules r \
         WHERE r.id = $1 AND r.account_id = $2 AND r.deleted_at IS NULL",
    )
    .bind::<SqlUuid, _>(rule)
    .bind::<SqlUuid, _>(account.0)
    .get_result(conn)
    .optional()?;
    decode(shown.ok_or(ApiError::NotFound("top-up rule"))?)
}

pub(crate) fn lock_account(conn: &mut PgConnection, account: AccountId) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Locked {
        #[diesel(sql_type = SqlUuid)]
        #[allow(dead_code)]
        id: Uuid,
    }
    diesel::sql_query("SELECT id FROM accounts WHERE id = $1 FOR NO KEY UPDATE")
        .bind::<SqlUuid, _>(account.0)
        .get_result::<Locked>(conn)
        .optional()?
        .ok_or(ApiError::NotFound("account"))?;
    Ok(())
}

pub(crate) fn check_time_zone(conn: &mut PgConnection, zone: &str) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Known {
        #[diesel(sql_type = Bool)]
        known: bool,
    }
    let known = diesel::sql_query(
        "SELECT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = $1) AS known",
    )
    .bind::<Text, _>(zone)
    .get_result::<Known>(conn)?
    .known;
    if known {
        Ok(())
    } else {
        Err(bad(format!(
            "time_zone {zone:?} is not a time zone name this service knows (an IANA name such \
             as Europe/Berlin, or UTC)"
        )))
    }
}

/// The account's threshold rule other than `except`, if any.
fn threshold_rule(
    conn: &mut PgConnection,
    account: AccountId,
    except: Option<Uuid>,
) -> Result<Option<Uuid>, ApiError> {
    #[derive(QueryableByName)]
    struct Found {
        #[diesel(sql_type = SqlUuid)]
        id: Uuid,
    }
    Ok(diesel::sql_query(
        "SELECT id FROM topup_rules WHERE account_id = $1 AND trigger = 'threshold' \
         AND deleted_at IS NULL AND id IS DISTINCT FROM $2",
    )
    .bind::<SqlUuid, _>(account.0)
    .bind::<Nullable<SqlUuid>, _>(except)
    .get_result::<Found>(conn)
    .optional()?
    .map(|found| found.id))
}

/// Judges the account's threshold rule after a change; the tokens a
/// top-up it made at once credited.
fn judge(conn: &mut PgConnection, account: AccountId, rearm: bool) -> Result<i64, ApiError> {
    diesel::sql_query("SELECT engine_topup_rule_changed($1, $2)")
        .bind::<SqlUuid, _>(account.0)
        .bind::<Bool, _>(rearm)
        .execute(conn)?;
    take_credited(conn)
}

fn write_rule(
    conn: &mut PgConnection,
    sql: &str,
    id: Uuid,
    account: AccountId,
    spec: &RuleSpec,
) -> Result<(), ApiError> {
    diesel::sql_query(sql)
        .bind::<SqlUuid, _>(id)
        .bind::<SqlUuid, _>(account.0)
        .bind::<Text, _>(text_of(spec.trigger))
        .bind::<Nullable<BigInt>, _>(spec.threshold_tokens)
        .bind::<Nullable<Text>, _>(spec.period.map(text_of))
        .bind::<Nullable<SmallInt>, _>(spec.anchor_day)
        .bind::<Text, _>(&spec.time_zone)
        .bind::<Text, _>(text_of(spec.method))
        .bind::<Nullable<BigInt>, _>(spec.tokens)
        .bind::<Nullable<BigInt>, _>(spec.target_tokens)
        .bind::<Text, _>(text_of(spec.mode))
        .bind::<Nullable<Integer>, _>(spec.request_ttl_seconds)
        .bind::<SmallInt, _>(spec.priority)
        .bind::<Nullable<BigInt>, _>(spec.expires_after_seconds)
        .bind::<Bool, _>(spec.expires_at_period_end)
        .bind::<Nullable<BigInt>, _>(spec.max_tokens_per_day)
        .bind::<Nullable<BigInt>, _>(spec.max_tokens_per_month)
        .bind::<Bool, _>(spec.enabled)
        .bind::<Nullable<BigInt>, _>(spec.price.as_ref().map(|price| price.amount_paid.get()))
        .bind::<Nullable<Text>, _>(spec.price.as_ref().map(|price| price.currency.as_str()))
        .bind::<Nullable<BigInt>, _>(spec.rollover.map(|(max, _)| max))
        .bind::<Nullable<BigInt>, _>(spec.rollover.and_then(|(_, after)| after))
        .execute(conn)?;
    Ok(())
}

fn audited(view: &TopupRuleView) -> Value {
    let mut value = serde_json::to_value(view).unwrap_or(Value::Null);
    if let Value::Object(object) = &mut value {
        // What the rule says, not what it did last.
        for done in ["last_firing", "armed", "unconsumed_tokens", "status"] {
            object.remove(done);
        }
    }
    value
}

/// Creates a rule. A threshold rule starts armed and is judged at once: an
/// account already below its threshold gets its top-up now. Answers the
/// rule and the tokens such a top-up credited (for the metrics).
pub fn create_rule(
    conn: &mut PgConnection,
    by: &Audit,
    account: AccountId,
    spec: RuleSpec,
) -> Result<(TopupRuleView, i64), ApiError> {
    conn.transaction(|conn| {
        lock_account(conn, account)?;
        check_time_zone(conn, &spec.time_zone)?;
        if spec.trigger == Trigger::Threshold {
            if let Some(rule_id) = threshold_rule(conn, account, None)? {
                return Err(ApiError::ThresholdRuleExists { rule_id });
            }
        }
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            rules: i64,
        }
        let live = diesel::sql_query(
            "SELECT count(*) AS rules FROM topup_rules WHERE account_id = $1 AND deleted_at IS NULL",
        )
        .bind::<SqlUuid, _>(account.0)
        .get_result::<Count>(conn)?
        .rules;
        if live >= RULES_PER_ACCOUNT_MAX {
            return Err(bad(format!(
                "an account has at most {RULES_PER_ACCOUNT_MAX} top-up rules; delete one first"
            )));
        }
        let id = Uuid::new_v4();
        write_rule(
            conn,
            "INSERT INTO topup_rules (id, account_id, trigger, threshold_tokens, period, \
             anchor_day, time_zone, method, tokens, target_tokens, mode, request_ttl_seconds, \
             priority, expires_after_seconds, expires_at_period_end, max_tokens_per_day, \
             max_tokens_per_month, enabled, amount_paid, currency, rollover_max_tokens, \
             rollover_expires_after_seconds) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18, $19, $20, $21, $22)",
            id,
            account,
            &spec,
        )?;
        let credited = judge(conn, account, spec.trigger == Trigger::Threshold && spec.enabled)?;
        let view = get_rule(conn, account, id)?;
        audit::record(
            conn,
            by,
            "topup_rule.created",
            &format!("topup_rule:{id}"),
            None,
            Some(audited(&view)),
        )?;
        Ok((view, credited))
    })
}

/// The members of a rule's view that a PATCH may lay over (its body's).
fn body_of(view: &TopupRuleView) -> Map<String, Value> {
    let mut object = match serde_json::to_value(view) {
        Ok(Value::Object(object)) => object,
        _ => Map::new(),
    };
    for derived in [
        "rule_id",
        "account_id",
        "armed",
        "unconsumed_tokens",
        "status",
        "created_at",
        "updated_at",
        "last_firing",
    ] {
        object.remove(derived);
    }
    // Defaults the POST body leaves out (and mode request refuses).
    object.retain(|name, value| {
        !value.is_null() && (name != "expires_at_period_end" || value != &Value::Bool(false))
    });
    object
}

/// Changes a rule: the PATCH's members replace the rule's (null removes an
/// optional one), and the result must be a valid rule. Changing a
/// threshold rule's threshold or enabling it again arms it (and judges it
/// at once); changing a schedule's period, anchor or time zone makes it
/// look at its current period again. Answers the rule and the tokens a
/// top-up made at once credited.
pub fn update_rule(
    conn: &mut PgConnection,
    by: &Audit,
    account: AccountId,
    rule: Uuid,
    patch: Map<String, Value>,
    parse: impl FnOnce(Map<String, Value>) -> Result<TopupRuleBody, ApiError>,
) -> Result<(TopupRuleView, i64), ApiError> {
    conn.transaction(|conn| {
        lock_account(conn, account)?;
        let before = get_rule(conn, account, rule)?;
        let mut merged = body_of(&before);
        for (name, value) in patch {
            if value.is_null() {
                merged.remove(&name);
            } else {
                merged.insert(name, value);
            }
        }
        let uncapped = before.max_tokens_per_day.is_none() && before.max_tokens_per_month.is_none();
        let caps_kept = ["max_tokens_per_day", "max_tokens_per_month"]
            .iter()
            .any(|cap| merged.contains_key(*cap));
        match merged.get("allow_uncapped") {
            // A rule without caps stays so; one losing its last cap must say so.
            None if uncapped => {
                merged.insert("allow_uncapped".to_owned(), Value::Bool(true));
            }
            None if !caps_kept => {
                return Err(bad(
                    "this change leaves the rule without a cap: keep max_tokens_per_day or \
                     max_tokens_per_month, or send allow_uncapped: true",
                ))
            }
            _ => {}
        }
        let spec = RuleSpec::try_from(parse(merged)?)?;
        check_time_zone(conn, &spec.time_zone)?;
        if spec.trigger == Trigger::Threshold {
            if let Some(rule_id) = threshold_rule(conn, account, Some(rule))? {
                return Err(ApiError::ThresholdRuleExists { rule_id });
            }
        }
        write_rule(
            conn,
            "UPDATE topup_rules SET trigger = $3, threshold_tokens = $4, period = $5, \
             anchor_day = $6, time_zone = $7, method = $8, tokens = $9, target_tokens = $10, \
             mode = $11, request_ttl_seconds = $12, priority = $13, expires_after_seconds = $14, \
             expires_at_period_end = $15, max_tokens_per_day = $16, max_tokens_per_month = $17, \
             enabled = $18, amount_paid = $19, currency = $20, rollover_max_tokens = $21, \
             rollover_expires_after_seconds = $22, updated_at = now(), \
             next_period_at = CASE WHEN (period, anchor_day, time_zone, trigger) \
                                        IS NOT DISTINCT FROM ($5, $6, $7, $3) \
                                   THEN next_period_at END \
             WHERE id = $1 AND account_id = $2",
            rule,
            account,
            &spec,
        )?;
        let rearm = spec.trigger == Trigger::Threshold
            && spec.enabled
            && (before.trigger != Trigger::Threshold
                || !before.enabled
                || before.threshold_tokens != spec.threshold_tokens);
        let credited = judge(conn, account, rearm)?;
        let after = get_rule(conn, account, rule)?;
        audit::record(
            conn,
            by,
            "topup_rule.updated",
            &format!("topup_rule:{rule}"),
            Some(audited(&before)),
            Some(audited(&after)),
        )?;
        Ok((after, credited))
    })
}

/// Deletes a rule: it never fires again. It is kept (its grants and
/// firings name it); a request it opened stays open until answered or
/// expired.
pub fn delete_rule(
    conn: &mut PgConnection,
    by: &Audit,
    account: AccountId,
    rule: Uuid,
) -> Result<(), ApiError> {
    conn.transaction(|conn| {
        lock_account(conn, account)?;
        let before = get_rule(conn, account, rule)?;
        diesel::sql_query(
            "UPDATE topup_rules SET deleted_at = now(), updated_at = now() \
             WHERE id = $1 AND account_id = $2",
        )
        .bind::<SqlUuid, _>(rule)
        .bind::<SqlUuid, _>(account.0)
        .execute(conn)?;
        judge(conn, account, false)?;
        audit::record(
            conn,
            by,
            "topup_rule.deleted",
            &format!("topup_rule:{rule}"),
            Some(audited(&before)),
            None,
        )
    })
}

/// The tokens the rules' own grants credited in this transaction so far
/// (the engine's tally `topup_credited`), for the credited metric once it
/// commits.
fn take_credited(conn: &mut PgConnection) -> Result<i64, ApiError> {
    #[derive(QueryableByName)]
    struct Taken {
        #[diesel(sql_type = BigInt)]
        credited: i64,
    }
    Ok(
        diesel::sql_query("SELECT engine_tally_take('topup_credited') AS credited")
            .get_result::<Taken>(conn)?
            .credited,
    )
}

/// The reaper's step: schedule rules whose period at `now` (the service's
/// clock) has not fired fire for it; open requests past their expiry
/// expire. Answers (rules looked at, requests expired, tokens the rules'
/// grants credited) of one batch.
pub fn run_schedules(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i32,
) -> Result<(i64, i64, i64), ApiError> {
    #[derive(QueryableByName)]
    struct Done {
        #[diesel(sql_type = Integer)]
        done: i32,
    }
    let (scheduled, credited) = conn.transaction(|conn| {
        let done = diesel::sql_query("SELECT engine_topup_schedule($1, $2) AS done")
            .bind::<diesel::sql_types::Timestamptz, _>(now)
            .bind::<Integer, _>(limit)
            .get_result::<Done>(conn)?;
        Ok::<_, ApiError>((done, take_credited(conn)?))
    })?;
    let expired = conn.transaction(|conn| {
        diesel::sql_query("SELECT engine_topup_expire_requests($1, $2) AS done")
            .bind::<diesel::sql_types::Timestamptz, _>(now)
            .bind::<Integer, _>(limit)
            .get_result::<Done>(conn)
    })?;
    Ok((i64::from(scheduled.done), i64::from(expired.done), credited))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_of_weeks_days_hours_minutes_seconds() {
        assert_eq!(parse_duration("d", "P30D").ok(), Some(30 * 86_400));
        assert_eq!(parse_duration("d", "PT2H").ok(), Some(7_200));
        assert_eq!(parse_duration("d", "P1W").ok(), Some(7 * 86_400));
        assert_eq!(parse_duration("d", "P1DT12H30M5S").ok(), Some(131_405));
        for bad in [
            "", "P", "PT", "30D", "P1M", "P1Y", "PT1D", "P1H", "PD", "P1DT", "P-1D", "P1D2",
        ] {
            assert!(parse_duration("d", bad).is_err(), "{bad:?} accepted");
        }
    }

    fn body(json: Value) -> Result<RuleSpec, ApiError> {
        RuleSpec::try_from(serde_json::from_value::<TopupRuleBody>(json).expect("shape"))
    }

    #[test]
    fn a_rule_holds_the_fields_of_its_trigger_method_and_mode_only() {
        let spec = body(serde_json::json!({
            "trigger": "threshold", "threshold_tokens": 10, "method": "fixed", "tokens": 50
        }))
        .expect("valid");
        assert_eq!(spec.mode, Mode::Grant);
        assert_eq!(spec.priority, 50);
        assert!(spec.enabled);
        for refused in [
            serde_json::json!({"trigger": "threshold", "method": "fixed", "tokens": 5}),
            serde_json::json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed",
                               "tokens": 5, "period": "daily"}),
            serde_json::json!({"trigger": "schedule", "period": "weekly", "method": "fixed",
                               "tokens": 5}),
            serde_json::json!({"trigger": "schedule", "period": "monthly", "anchor_day": 29,
                               "method": "fixed", "tokens": 5}),
            serde_json::json!({"trigger": "schedule", "period": "daily", "anchor_day": 1,
                               "method": "fixed", "tokens": 5}),
            serde_json::json!({"trigger": "threshold", "threshold_tokens": 5, "method": "target",
                               "tokens": 5}),
            serde_json::json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed",
                               "tokens": 5, "request_ttl": "PT1H"}),
            serde_json::json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed",
                               "tokens": 5, "expires_at_period_end": true}),
            serde_json::json!({"trigger": "schedule", "period": "daily", "method": "fixed",
                               "tokens": 5, "expires_at_period_end": true,
                               "expires_after": "P1D"}),
            serde_json::json!({"trigger": "threshold", "threshold_tokens": 0, "method": "fixed",
                               "tokens": 5}),
            serde_json::json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed",
                               "tokens": 5, "max_tokens_per_day": 0}),
            serde_json::json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed",
                               "tokens": 5, "max_tokens_per_month": 4}),
            serde_json::json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed",
                               "tokens": 5, "mode": "request", "priority": 0}),
        ] {
            assert!(body(refused.clone()).is_err(), "{refused} accepted");
        }
        let request = body(serde_json::json!({
            "trigger": "schedule", "period": "monthly", "anchor_day": 1, "method": "target",
            "target_tokens": 100, "mode": "request"
        }))
        .expect("valid");
        assert_eq!(
            request.request_ttl_seconds,
            i32::try_from(REQUEST_TTL_DEFAULT_SECONDS).ok()
        );
    }
}
