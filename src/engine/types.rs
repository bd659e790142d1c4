//! Parse, don't validate: newtypes whose constructors enforce the limits of
//! `config.rs`, so an out-of-range value cannot reach the domain.
//!
//! Their OpenAPI schemas are written by hand from the same constants (not
//! derived), so the documented bounds cannot drift from the enforced ones.

use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use uuid::Uuid;

use crate::config::{
    AMOUNT_MAX, NAME_LENGTH_MAX, REASON_LENGTH_MAX, TTL_SECONDS_MAX, TTL_SECONDS_MIN,
};

macro_rules! id_newtype {
    ($name:ident, $what:literal) => {
        #[doc = concat!("The id of ", $what, ".")]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        // On the wire the id is the bare UUID (`serde(transparent)`).
        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
                    .description(Some(concat!("The id of ", $what, ".")))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

id_newtype!(AccountId, "an account");
id_newtype!(ReservationId, "a reservation");
id_newtype!(RequestId, "a client request (the kiosk's idempotency key)");
id_newtype!(ApiKeyId, "an API key");

/// A positive number of tokens, 1 … 1,000,000.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Tokens(i64);

impl Tokens {
    pub fn parse(value: i64) -> Result<Self, String> {
        if (1..=AMOUNT_MAX).contains(&value) {
            Ok(Tokens(value))
        } else {
            Err(format!(
                "amount must be between 1 and {AMOUNT_MAX}, got {value}"
            ))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl TryFrom<i64> for Tokens {
    type Error = String;
    fn try_from(value: i64) -> Result<Self, String> {
        Tokens::parse(value)
    }
}

impl From<Tokens> for i64 {
    fn from(tokens: Tokens) -> i64 {
        tokens.0
    }
}

/// A signed, non-zero adjustment of at most 1,000,000 tokens either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct SignedTokens(i64);

impl SignedTokens {
    pub fn get(self) -> i64 {
        self.0
    }
}

impl TryFrom<i64> for SignedTokens {
    type Error = String;
    fn try_from(value: i64) -> Result<Self, String> {
        if value != 0 && (-AMOUNT_MAX..=AMOUNT_MAX).contains(&value) {
            Ok(SignedTokens(value))
        } else {
            Err(format!(
                "amount must be non-zero and between -{AMOUNT_MAX} and {AMOUNT_MAX}, got {value}"
            ))
        }
    }
}

impl From<SignedTokens> for i64 {
    fn from(tokens: SignedTokens) -> i64 {
        tokens.0
    }
}

/// A grant's priority, 0 … 100 (0 is drawn first); 50 when a credit
/// names none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Priority(i16);

impl Priority {
    pub const DEFAULT: Priority = Priority(50);

    pub fn get(self) -> i16 {
        self.0
    }
}

impl Default for Priority {
    fn default() -> Self {
        Priority::DEFAULT
    }
}

impl TryFrom<i64> for Priority {
    type Error = String;
    fn try_from(value: i64) -> Result<Self, String> {
        match i16::try_from(value) {
            Ok(priority) if (0..=100).contains(&priority) => Ok(Priority(priority)),
            _ => Err(format!("priority must be between 0 and 100, got {value}")),
        }
    }
}

impl From<Priority> for i64 {
    fn from(priority: Priority) -> i64 {
        i64::from(priority.0)
    }
}

/// When a grant lapses: at most [`GRANT_EXPIRY_MAX_YEARS`] years ahead, as
/// RFC 3339 (kept to the microsecond, as PostgreSQL stores it, so an answer
/// and a replay compare what was stored). That it lies in the future is
/// the engine's decision (`engine_external`), after the replay check: a
/// retry of a credit that landed is its replay even once its expiry has
/// passed.
/// Read by the one instant parser (`crate::time::parse_instant`: RFC 3339
/// or a bare date as its midnight UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GrantExpiry(chrono::DateTime<chrono::Utc>);

/// How far ahead a grant's expiry may lie.
pub const GRANT_EXPIRY_MAX_YEARS: i64 = 10;

impl GrantExpiry {
    pub fn get(self) -> chrono::DateTime<chrono::Utc> {
        self.0
    }

    /// `at` as an expiry asked for at `now`.
    pub fn at(
        at: chrono::DateTime<chrono::Utc>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<GrantExpiry, String> {
        use chrono::{DurationRound, TimeDelta};
        let at = at
            .duration_trunc(TimeDelta::microseconds(1))
            .map_err(|error| format!("expires_at cannot be stored: {error}"))?;
        // 365.25 days a year: ten years from now, leap days included.
        if at - now > TimeDelta::days(GRANT_EXPIRY_MAX_YEARS * 36_525 / 100) {
            return Err(format!(
                "expires_at must lie within {GRANT_EXPIRY_MAX_YEARS} years, got {}",
                at.to_rfc3339()
            ));
        }
        Ok(GrantExpiry(at))
    }
}

impl TryFrom<chrono::DateTime<chrono::Utc>> for GrantExpiry {
    type Error = String;
    fn try_from(at: chrono::DateTime<chrono::Utc>) -> Result<Self, String> {
        GrantExpiry::at(at, chrono::Utc::now())
    }
}

impl TryFrom<String> for GrantExpiry {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        GrantExpiry::try_from(crate::time::instant_of("expires_at", &text)?)
    }
}

impl From<GrantExpiry> for String {
    fn from(expiry: GrantExpiry) -> String {
        crate::time::rfc3339(expiry.0)
    }
}

impl From<GrantExpiry> for chrono::DateTime<chrono::Utc> {
    fn from(expiry: GrantExpiry) -> Self {
        expiry.0
    }
}

impl utoipa::PartialSchema for GrantExpiry {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::DateTime,
            )))
            .description(Some(
                "When the grant lapses: RFC 3339, or a date (YYYY-MM-DD) as its midnight UTC; in the future and within 10 years.",
            ))
            .into()
    }
}

impl utoipa::ToSchema for GrantExpiry {}

/// Tokens a reservation drew from one grant (`reservations.draws` holds
/// them in draw order). `grant_id` is null only on an account whose grants
/// did not hold its available tokens (a broken invariant the checks report).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Draw {
    pub grant_id: Option<uuid::Uuid>,
    pub amount: i64,
}

/// A reservation's draws as the engine wrote them (`reservations.draws`).
pub fn draws_of(value: &serde_json::Value) -> Vec<Draw> {
    Vec::<Draw>::deserialize(value).unwrap_or_default()
}

/// A reservation lifetime, 1 … 86,400 seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct TtlSeconds(i32);

impl TtlSeconds {
    pub fn get(self) -> i32 {
        self.0
    }
}

impl TryFrom<i64> for TtlSeconds {
    type Error = String;
    fn try_from(value: i64) -> Result<Self, String> {
        if (i64::from(TTL_SECONDS_MIN)..=i64::from(TTL_SECONDS_MAX)).contains(&value) {
            // The range check above guarantees the value fits.
            Ok(TtlSeconds(i32::try_from(value).map_err(|e| e.to_string())?))
        } else {
            Err(format!(
                "ttl_seconds must be between {TTL_SECONDS_MIN} and {TTL_SECONDS_MAX}, got {value}"
            ))
        }
    }
}

impl From<TtlSeconds> for i64 {
    fn from(ttl: TtlSeconds) -> i64 {
        i64::from(ttl.0)
    }
}

/// The most a grant's price may be, in minor units: 10^15 (ten trillion
/// of a currency with cents), so that a price times a grant's tokens stays
/// exact in the revenue report's arithmetic (numeric).
pub const AMOUNT_PAID_MAX: i64 = 1_000_000_000_000_000;

/// What was paid for a grant, in minor units of its currency (cents):
/// 0 … 10^15; 0 is a promotional grant. Money is never a float.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct MinorUnits(i64);

impl MinorUnits {
    pub fn get(self) -> i64 {
        self.0
    }
}

impl TryFrom<i64> for MinorUnits {
    type Error = String;
    fn try_from(value: i64) -> Result<Self, String> {
        if (0..=AMOUNT_PAID_MAX).contains(&value) {
            Ok(MinorUnits(value))
        } else {
            Err(format!(
                "amount_paid must be a whole number of minor units between 0 and {AMOUNT_PAID_MAX}, got {value}"
            ))
        }
    }
}

impl From<MinorUnits> for i64 {
    fn from(amount: MinorUnits) -> i64 {
        amount.0
    }
}

impl utoipa::PartialSchema for MinorUnits {
    fn schema() -> RefOr<Schema> {
        integer_schema(
            0,
            AMOUNT_PAID_MAX,
            "Money in minor units of its currency (cents for EUR or USD); 0 is promotional.",
        )
    }
}

impl utoipa::ToSchema for MinorUnits {}

/// An ISO 4217 currency code, as the standard lists it (`EUR`, `USD`,
/// `JPY`…; read by the `iso_currency` crate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Currency(String);

impl Currency {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Currency {
    type Error = String;
    fn try_from(code: String) -> Result<Self, String> {
        match iso_currency::Currency::from_code(&code) {
            Some(currency) => Ok(Currency(currency.code().to_owned())),
            None => Err(format!(
                "currency must be an ISO 4217 code such as EUR or USD, got {:?}",
                code.chars().take(8).collect::<String>()
            )),
        }
    }
}

impl From<Currency> for String {
    fn from(currency: Currency) -> String {
        currency.0
    }
}

impl utoipa::PartialSchema for Currency {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[A-Z]{3}$"))
            .description(Some("An ISO 4217 currency code (EUR, USD, …)."))
            .into()
    }
}

impl utoipa::ToSchema for Currency {}

/// A grant's price: what was paid for all of its tokens. A grant without
/// one is unpriced (the revenue report never guesses its value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Price {
    pub amount_paid: MinorUnits,
    pub currency: Currency,
}

impl Price {
    /// The price a request's two optional fields give: both or neither.
    pub fn of(
        amount_paid: Option<MinorUnits>,
        currency: Option<Currency>,
    ) -> Result<Option<Price>, String> {
        match (amount_paid, currency) {
            (Some(amount_paid), Some(currency)) => Ok(Some(Price {
                amount_paid,
                currency,
            })),
            (None, None) => Ok(None),
            _ => Err(
                "amount_paid and currency go together: give both, or neither for an unpriced grant"
                    .into(),
            ),
        }
    }
}

/// The schema of an integer newtype: its bounds, as enforced by `try_from`.
fn integer_schema(minimum: i64, maximum: i64, description: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(minimum))
        .maximum(Some(maximum))
        .description(Some(description))
        .into()
}

impl utoipa::PartialSchema for Tokens {
    fn schema() -> RefOr<Schema> {
        integer_schema(1, AMOUNT_MAX, "A positive number of tokens.")
    }
}

impl utoipa::ToSchema for Tokens {}

impl utoipa::PartialSchema for SignedTokens {
    fn schema() -> RefOr<Schema> {
        // JSON Schema's `not: {const: 0}` has no builder here: the
        // description carries the non-zero rule.
        integer_schema(
            -AMOUNT_MAX,
            AMOUNT_MAX,
            "A signed number of tokens; must not be 0 (negative removes tokens).",
        )
    }
}

impl utoipa::ToSchema for SignedTokens {}

impl utoipa::PartialSchema for TtlSeconds {
    fn schema() -> RefOr<Schema> {
        integer_schema(
            i64::from(TTL_SECONDS_MIN),
            i64::from(TTL_SECONDS_MAX),
            "A reservation lifetime in seconds.",
        )
    }
}

impl utoipa::ToSchema for TtlSeconds {}

impl utoipa::PartialSchema for Priority {
    fn schema() -> RefOr<Schema> {
        integer_schema(
            0,
            100,
            "A grant's priority: grants of a lower priority are drawn first.",
        )
    }
}

impl utoipa::ToSchema for Priority {}

/// Text a person typed (names, labels, references): trimmed of nothing,
/// 1 … N characters, no control characters.
fn bounded_text(field: &str, value: String, max: usize) -> Result<String, String> {
    let length = value.chars().count();
    if length == 0 || length > max {
        return Err(format!(
            "{field} must be 1 to {max} characters, got {length}"
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field} must not contain control characters"));
    }
    Ok(value)
}

/// A character a name people read must not hold: a control character, or
/// one that is invisible or changes the direction of the text — every
/// `Default_Ignorable_Code_Point` of Unicode's derived tables (variation
/// selectors, zero-width spaces and joiners, the soft hyphen, Hangul and
/// Mongolian fillers, the Khmer inherent vowels, tags), read from the
/// `icu_properties` crate's data rather than listed here; besides them,
/// format characters (Unicode category Cf: bidi overrides and isolates such
/// as U+202E, the BOM), line and paragraph separators (Zl, Zp:
/// U+2028/U+2029), private-use code points (Co), and the two fillers that
/// draw nothing but Unicode does not list as ignorable ([`BLANK_FILLERS`]).
fn hidden_in_names(character: char) -> bool {
    use icu_properties::props::DefaultIgnorableCodePoint;
    use icu_properties::CodePointSetData;
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    character.is_control()
        || CodePointSetData::new::<DefaultIgnorableCodePoint>().contains(character)
        || matches!(
            character.general_category(),
            GeneralCategory::Format
                | GeneralCategory::LineSeparator
                | GeneralCategory::ParagraphSeparator
                | GeneralCategory::PrivateUse
        )
        || BLANK_FILLERS.contains(&character)
}

/// Characters that draw nothing, alone, and are not
/// `Default_Ignorable_Code_Point`: the braille pattern blank and the
/// Khitan small script filler.
const BLANK_FILLERS: [char; 2] = ['\u{2800}', '\u{16FE4}'];

/// A name people read and tell apart (an account's name, a key's label):
/// trimmed of leading and trailing whitespace (the no-break space too;
/// not tabs or line breaks, which are refused as control characters),
/// then [`bounded_text`], no character of [`hidden_in_names`], not empty;
/// stored in Unicode normalization form C, so the same name typed two ways
/// is one name.
fn display_name(field: &str, value: String, max: usize) -> Result<String, String> {
    use unicode_normalization::UnicodeNormalization;
    let value: String = value.nfc().collect();
    // Control characters are refused below, not trimmed away.
    let trimmed = value.trim_matches(|c: char| c.is_whitespace() && !c.is_control());
    if trimmed.is_empty() && !value.is_empty() {
        return Err(format!("{field} must not be only whitespace"));
    }
    let value = bounded_text(field, trimmed.to_owned(), max)?;
    if let Some(refused) = value.chars().find(|character| hidden_in_names(*character)) {
        return Err(format!(
            "{field} must not contain invisible or direction-changing characters \
             (found U+{:04X})",
            u32::from(refused)
        ));
    }
    Ok(value)
}

/// The OpenAPI `pattern` of a display name, generated from the same rules
/// (so the document is exactly as strict as the check): no character of
/// [`hidden_in_names`], and at least one that is not whitespace. Code
/// points above U+FFFF are written as themselves.
fn display_name_pattern() -> &'static str {
    static PATTERN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| {
        let hidden = character_class(hidden_in_names);
        let hidden_or_blank =
            character_class(|character| hidden_in_names(character) || character.is_whitespace());
        format!("^[^{hidden}]*[^{hidden_or_blank}][^{hidden}]*$")
    })
}

/// The ranges of the characters for which `member` holds, as the inside of
/// a regular expression character class.
fn character_class(member: impl Fn(char) -> bool) -> String {
    let escape = |character: char| {
        let code = u32::from(character);
        if code <= 0xFFFF {
            format!("\\u{code:04X}")
        } else {
            character.to_string()
        }
    };
    let mut class = String::new();
    let mut run: Option<(char, char)> = None;
    let close = |run: (char, char), class: &mut String| {
        class.push_str(&escape(run.0));
        if run.1 != run.0 {
            class.push('-');
            class.push_str(&escape(run.1));
        }
    };
    for character in (0..=0x10FFFF_u32).filter_map(char::from_u32) {
        let adjacent = |end: char| u32::from(character) == u32::from(end) + 1;
        match (member(character), run) {
            (true, Some((start, end))) if adjacent(end) => run = Some((start, character)),
            (true, Some(done)) => {
                close(done, &mut class);
                run = Some((character, character));
            }
            (true, None) => run = Some((character, character)),
            (false, Some(done)) => {
                close(done, &mut class);
                run = None;
            }
            (false, None) => {}
        }
    }
    if let Some(done) = run {
        close(done, &mut class);
    }
    class
}

macro_rules! text_newtype {
    ($name:ident, $field:literal, $max:expr) => {
        text_newtype!(
            $name,
            $field,
            $max,
            bounded_text,
            "^[^\\u0000-\\u001F\\u007F-\\u009F]+$",
            "Text of 1 to `maxLength` characters, no control characters."
        );
    };
    ($name:ident, $field:literal, $max:expr, $check:ident, $pattern:expr, $description:literal) => {
        #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(value: String) -> Result<Self, String> {
                $check($field, value, $max).map($name)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .max_length(Some($max))
                    .pattern(Some($pattern))
                    .description(Some($description))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

text_newtype!(
    Name,
    "name",
    NAME_LENGTH_MAX,
    display_name,
    display_name_pattern(),
    "Text of 1 to `maxLength` characters, not only whitespace; no control characters, \
     no invisible or direction-changing ones (Unicode Default_Ignorable_Code_Point, Cf, Zl, Zp, private use). \
     Leading and trailing whitespace is trimmed; stored in Unicode normalization form C."
);
text_newtype!(
    Label,
    "label",
    NAME_LENGTH_MAX,
    display_name,
    display_name_pattern(),
    "Text of 1 to `maxLength` characters, not only whitespace; no control characters, \
     no invisible or direction-changing ones (Unicode Default_Ignorable_Code_Point, Cf, Zl, Zp, private use). \
     Leading and trailing whitespace is trimmed; stored in Unicode normalization form C."
);
text_newtype!(ExternalRef, "external_ref", NAME_LENGTH_MAX);
text_newtype!(Reason, "reason", REASON_LENGTH_MAX);
text_newtype!(Note, "note", REASON_LENGTH_MAX);

/// SHA-256 of `bytes` (key secrets, canonical job requests).
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_bounds() {
        assert!(Tokens::parse(0).is_err());
        assert!(Tokens::parse(-1).is_err());
        assert!(Tokens::parse(1_000_001).is_err());
        assert_eq!(Tokens::parse(1_000_000).map(Tokens::get), Ok(1_000_000));
        assert!(SignedTokens::try_from(0).is_err());
        assert_eq!(SignedTokens::try_from(-5).map(SignedTokens::get), Ok(-5));
        assert!(TtlSeconds::try_from(0).is_err());
        assert!(TtlSeconds::try_from(86_401).is_err());
        assert!(TtlSeconds::try_from(i64::MAX).is_err());
    }

    #[test]
    fn names_people_read_are_visible_and_normalised() {
        for refused in [
            "Wedding\u{202E}kiosk",
            "Wed\u{200B}ding",
            "\u{FEFF}Wedding",
            "Wedding\u{2028}kiosk",
            "Wedding\u{2066}kiosk\u{2069}",
            "Wed\u{200D}ding",
            "Wed\u{00AD}ding",
            "\u{3164}",
            "Wedding\u{E000}",
            "Wedding\u{FE0F}",
            "   ",
            "\u{00A0}\u{2003}",
            // Default_Ignorable_Code_Point beyond category Cf.
            "Wed\u{180B}ding",
            "Wed\u{180C}ding",
            "Wed\u{180D}ding",
            "Wed\u{180F}ding",
            "Wed\u{17B4}ding",
            "Wed\u{17B5}ding",
            "Wed\u{16FE4}ding",
            "Wedding\u{E0041}",
        ] {
            assert!(Name::try_from(refused.to_owned()).is_err(), "{refused:?}");
            assert!(Label::try_from(refused.to_owned()).is_err(), "{refused:?}");
        }
        // "é" as e + combining acute is stored as the one character é.
        assert_eq!(
            Name::try_from("Cafe\u{301}".to_owned()).map(String::from),
            Ok("Caf\u{E9}".to_owned())
        );
        // Names are trimmed, no-break spaces too.
        assert_eq!(
            Name::try_from(" \u{A0}Booth 7\u{2003} ".to_owned()).map(String::from),
            Ok("Booth 7".to_owned())
        );
        for accepted in ["Müller's booth", "東京 kiosk", "Booth #7 — lobby"] {
            assert_eq!(
                Name::try_from(accepted.to_owned()).map(String::from),
                Ok(accepted.to_owned())
            );
        }
        // The document's pattern says the same, character by character.
        let pattern = display_name_pattern();
        assert!(
            pattern.starts_with("^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD"),
            "{pattern}"
        );
        // Zero-width spaces and joiners, directional marks; separators and
        // bidi embeddings and overrides.
        assert!(pattern.contains("\\u200B-\\u200F"), "{pattern}");
        assert!(pattern.contains("\\u2028-\\u202E"), "{pattern}");
        // Other text (references, reasons) keeps what was sent.
        assert!(ExternalRef::try_from("ref\u{200B}1".to_owned()).is_ok());
    }

    #[test]
    fn text_bounds() {
        assert!(Name::try_from(String::new()).is_err());
        assert!(Name::try_from("a\u{0}b".to_owned()).is_err());
        assert!(Name::try_from("x".repeat(201)).is_err());
        assert_eq!(
            Name::try_from("Wedding kiosk".to_owned()).map(String::from),
            Ok("Wedding kiosk".to_owned())
        );
    }
}
