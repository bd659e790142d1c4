//! Keeping secrets out of everything the binaries print.
//!
//! A database URL carries a password (`postgres://user:secret@host/db`, or
//! `password=secret` in libpq's key=value form), and libpq and the URL
//! parsers repeat the whole string in their own errors when it is
//! malformed. So the rule is not "format the URL carefully where we print
//! it" but "nothing reaches stderr unscrubbed":
//!
//! - at start, before anything is parsed or logged, the passwords of
//!   `DATABASE_URL` / `DATABASE_READ_URL` (environment and flags) and the
//!   bootstrap `ADMIN_API_KEY` are registered ([`register_connection_string`],
//!   [`register`]), however malformed the URL is;
//! - every log line goes through [`ScrubbingWriter`], every error the
//!   binaries print through [`scrub`], and panics through the hook of
//!   [`install_panic_hook`];
//! - [`scrub`] masks both what looks like credentials in any connection
//!   string it meets ([`redact_connection_strings`]) and every registered
//!   secret, verbatim, percent-decoded or JSON-escaped, wherever it appears.
//!
//! Registered secrets shorter than [`SECRET_LENGTH_MIN`] are masked only where
//! they look like credentials, not everywhere: blindly replacing a
//! two-letter password would garble every log line.

use std::io::Write;
use std::sync::RwLock;

/// Shortest registered secret replaced wherever it appears.
pub const SECRET_LENGTH_MIN: usize = 4;

const MASK: &str = "***";

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Registers `secret`: from now on [`scrub`] masks it wherever it appears.
pub fn register(secret: &str) {
    if secret.chars().count() < SECRET_LENGTH_MIN {
        return;
    }
    let mut forms = vec![secret.to_owned()];
    if let Ok(decoded) = percent_decode(secret) {
        forms.push(decoded);
    }
    // How a JSON log line writes it (`"` and `\` escaped).
    for form in forms.clone() {
        if let Ok(json) = serde_json::to_string(&form) {
            forms.push(json[1..json.len() - 1].to_owned());
        }
    }
    let mut secrets = SECRETS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for form in forms {
        if form.chars().count() >= SECRET_LENGTH_MIN && !secrets.contains(&form) {
            secrets.push(form);
        }
    }
    // Longest first, so a secret containing another is masked whole.
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
}

/// Registers the passwords of a connection string (URL or key=value form),
/// well-formed or not.
pub fn register_connection_string(connection: &str) {
    for secret in connection_string_secrets(connection) {
        register(&secret);
    }
}

/// Registers the secrets the process was started with, from the
/// environment: call first thing in `main`, before anything can fail.
pub fn register_environment() {
    for variable in ["DATABASE_URL", "DATABASE_READ_URL", "TEST_DATABASE_SERVER"] {
        if let Ok(value) = std::env::var(variable) {
            register_connection_string(&value);
        }
    }
    if let Ok(key) = std::env::var("ADMIN_API_KEY") {
        register(&key);
    }
}

/// `text` fit to print: credentials in any connection string masked, and
/// every registered secret replaced by `***`.
pub fn scrub(text: &str) -> String {
    let mut scrubbed = redact_connection_strings(text);
    let secrets = SECRETS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for secret in secrets.iter() {
        if scrubbed.contains(secret.as_str()) {
            scrubbed = scrubbed.replace(secret.as_str(), MASK);
        }
    }
    scrubbed
}

/// The passwords in a connection string: the part of a URL's user info
/// after its first `:` (up to the last `@`), and every `password=` value.
fn connection_string_secrets(connection: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    // The string itself: a `"` in it is part of a password, not a quote.
    for token in connection
        .split(char::is_whitespace)
        .filter(|token| token.contains('@'))
    {
        if let Some(range) = userinfo_password(token) {
            secrets.push(token[range].to_owned());
        }
    }
    let mut rest = connection;
    while let Some((value_start, value_end)) = next_password_value(rest) {
        let value = &rest[value_start..value_end];
        match value.strip_prefix('\'') {
            Some(inner) => {
                let inner = inner.strip_suffix('\'').unwrap_or(inner);
                secrets.push(inner.replace("\\'", "'"));
                // Unterminated: at least its first word is the password.
                if let Some(word) = inner.split_whitespace().next() {
                    secrets.push(word.to_owned());
                }
            }
            None => secrets.push(value.to_owned()),
        }
        rest = &rest[value_end..];
    }
    secrets.retain(|secret| !secret.is_empty());
    secrets
}

/// Masks credentials in every connection string inside `text`: a URL's
/// password (`scheme://user:***@host`, also when the URL is malformed:
/// `postgres//user:***@host`, `user:***@host`), and the value of every
/// `password=` setting (`password=***`, quoted or not, in a URL's query or
/// in libpq's key=value form).
pub fn redact_connection_strings(text: &str) -> String {
    let mut masked = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((value_start, value_end)) = next_password_value(rest) {
        masked.push_str(&rest[..value_start]);
        masked.push_str(MASK);
        rest = &rest[value_end..];
    }
    masked.push_str(rest);

    let mut redacted = String::with_capacity(masked.len());
    let mut cursor = 0;
    for token in tokens(&masked) {
        let offset = token.as_ptr() as usize - masked.as_ptr() as usize;
        if let Some(range) = userinfo_password(token) {
            redacted.push_str(&masked[cursor..offset + range.start]);
            redacted.push_str(MASK);
            cursor = offset + range.end;
        }
    }
    redacted.push_str(&masked[cursor..]);
    redacted
}

/// The pieces of `text` a connection string can be: runs without
/// whitespace or double quotes (libpq quotes what it repeats).
fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || c == '"')
        .filter(|token| token.contains('@'))
}

/// In one token holding an `@`: where its password is. The user info runs
/// from after `://` (or the first `//`, or the token's start) to the last
/// `@`; the password is what follows its first `:`. Without a `:`, the user
/// info is a bare user name in a well-formed URL, but may be a password in
/// a malformed one (`postgres//secret@host`), so it is masked whole; a bare
/// `name@host` with no slashes at all (an e-mail address) is left alone.
fn userinfo_password(token: &str) -> Option<std::ops::Range<usize>> {
    let at = token.rfind('@')?;
    let start = token[..at]
        .find("://")
        .map(|scheme| scheme + 3)
        .or_else(|| token[..at].find("//").map(|slashes| slashes + 2))
        .unwrap_or(0);
    let userinfo = &token[start..at];
    if userinfo.is_empty() || userinfo == MASK {
        return None;
    }
    match userinfo.find(':') {
        Some(colon) if &userinfo[colon + 1..] == MASK || colon + 1 == userinfo.len() => None,
        Some(colon) => Some(start + colon + 1..at),
        None if start == 0 || token[..at].contains("://") => None,
        None => Some(start..at),
    }
}

/// The byte range of the next `password=` value in `text` (the keyword in
/// any case, with optional spaces around `=`), quoted (`'…'`, with `\'`
/// escapes) or running to the next space or `&`.
fn next_password_value(text: &str) -> Option<(usize, usize)> {
    let lower = text.to_ascii_lowercase();
    let mut search_from = 0;
    while let Some(found) = lower[search_from..].find("password") {
        let keyword_end = search_from + found + "password".len();
        let after = &text[keyword_end..];
        let trimmed = after.trim_start_matches(' ');
        if let Some(value) = trimmed.strip_prefix('=') {
            let value_text = value.trim_start_matches(' ');
            let value_start = text.len() - value_text.len();
            let value_length = if let Some(quoted) = value_text.strip_prefix('\'') {
                let mut escaped = false;
                let mut end = None;
                for (index, c) in quoted.char_indices() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '\'' if !escaped => {
                            end = Some(index + 2);
                            break;
                        }
                        _ => escaped = false,
                    }
                }
                end.unwrap_or(value_text.len())
            } else {
                // libpq gives `"` no meaning here: it is part of the value.
                value_text
                    .find(|c: char| c.is_whitespace() || c == '&')
                    .unwrap_or(value_text.len())
            };
            if value_length > 0 && &value_text[..value_length] != MASK {
                return Some((value_start, value_start + value_length));
            }
        }
        search_from = keyword_end;
    }
    None
}

fn percent_decode(text: &str) -> Result<String, ()> {
    if !text.contains('%') {
        return Err(());
    }
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' && index + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[index + 1..index + 3]).map_err(|_| ())?;
            decoded.push(u8::from_str_radix(hex, 16).map_err(|_| ())?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| ())
}

/// Writes to stderr what [`scrub`] leaves of each write. `tracing`'s
/// formatter hands over one whole log line per write, so a secret never
/// straddles two writes.
pub struct ScrubbingWriter;

impl Write for ScrubbingWriter {
    fn write(&mut self, buffer: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buffer);
        std::io::stderr().write_all(scrub(&text).as_bytes())?;
        Ok(buffer.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Panic messages (which may carry an error's text) are scrubbed too.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|location| format!(" at {}:{}", location.file(), location.line()))
            .unwrap_or_default();
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        eprintln!("thread '{name}' panicked{location}:\n{}", scrub(&payload));
    }));
}

/// A webhook receiver's URL fit to show: its scheme, host and port. A
/// receiver's URL is often its credential (a token in the query or the
/// path, or userinfo), so everything after the authority becomes
/// `/[redacted]`. Idempotent; a text that is no URL becomes `[redacted]`.
pub fn redact_url(url: &str) -> String {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return "[redacted]".to_owned();
    };
    let Some(host) = parsed.host_str() else {
        return "[redacted]".to_owned();
    };
    let port = parsed
        .port()
        .map(|port| format!(":{port}"))
        .unwrap_or_default();
    let bare = parsed.path() == "/"
        && parsed.query().is_none()
        && parsed.fragment().is_none()
        && parsed.username().is_empty()
        && parsed.password().is_none();
    let rest = if bare { "/" } else { "/[redacted]" };
    format!("{}://{host}{port}{rest}", parsed.scheme())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_well_formed_and_malformed_urls() {
        for (url, expected) in [
            (
                "postgres://u:hunter2@h:5432/db?sslmode=disable",
                "postgres://u:***@h:5432/db?sslmode=disable",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("postgres//u:hunter2@h/db", "postgres//u:***@h/db"),
            ("postgres:/u:hunter2@h/db", "postgres:***@h/db"),
            ("postgres//hunter2@h/db", "postgres//***@h/db"),
            ("u:hunter2@h/db", "u:***@h/db"),
            ("write to ops@example.com", "write to ops@example.com"),
            ("mysql://root:hunter2@h/db", "mysql://root:***@h/db"),
            (
                "postgres://u:hunter2@h:port/db",
                "postgres://u:***@h:port/db",
            ),
            ("postgres://u:hunter2@[::1/db", "postgres://u:***@[::1/db"),
            ("postgres://u:hun/ter@2@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u@h1:5432,h2:5433/db?password=hunter2&x=1",
                "postgres://u@h1:5432,h2:5433/db?password=***&x=1",
            ),
            (
                "host=h user=u password=hunter2 dbname=db",
                "host=h user=u password=*** dbname=db",
            ),
            (
                "host=h password = 'hun ter\\'2' dbname=db",
                "host=h password = *** dbname=db",
            ),
            (
                "missing \"=\" after \"mysql://root:hunter2@h/db\" in connection info string",
                "missing \"=\" after \"mysql://root:***@h/db\" in connection info string",
            ),
        ] {
            assert_eq!(redact_connection_strings(url), expected, "{url}");
        }
    }

    #[test]
    fn registered_secrets_are_masked_everywhere() {
        register_connection_string("postgres//u:Sup3r\"Secret%21@h/db");
        let scrubbed = scrub("error near Sup3r\"Secret! and Sup3r\\\"Secret%21 in json");
        assert!(!scrubbed.contains("Sup3r"), "{scrubbed}");
        register_connection_string("host=h password='pa ss word'");
        assert_eq!(scrub("read pa ss word there"), "read *** there");
        register("xy");
        assert_eq!(
            scrub("xy stays: too short to replace blindly"),
            "xy stays: too short to replace blindly"
        );
    }
}
