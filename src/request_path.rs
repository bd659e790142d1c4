//! One canonical request path, made before anything looks at the path (the
//! metrics' route label, the address throttle, idempotency scopes,
//! routing): every check sees the path the router routes.
//!
//! Rules:
//! - a percent-encoded unreserved character (RFC 3986 §2.3: letters,
//!   digits, `-`, `.`, `_`, `~`) is decoded: `/%761/me` is `/v1/me`;
//! - any other escape (`%2F`, `%25`, `%00`, a non-ASCII byte, a malformed
//!   one) is refused with 400: a path the router would read differently
//!   from the checks before it is not served;
//! - a `.` or `..` segment is refused with 400 (nothing resolves them);
//! - a segment that is a UUID (any case, with or without hyphens) is
//!   written as routes print ids: lower case, hyphenated; any other
//!   spelling of one (braces, `urn:uuid:`) is refused.
//!
//! The query string is left as sent.

use std::borrow::Cow;

use uuid::Uuid;

/// Characters a URI never needs to escape (RFC 3986 §2.3).
fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

fn hex_digit(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|digit| u8::try_from(digit).ok())
}

/// `path` with unreserved escapes decoded, or why it is refused; `path`
/// itself when there is nothing to decode (what nearly every request
/// sends: no copy).
fn decoded(path: &str) -> Result<Cow<'_, str>, String> {
    if path.is_ascii() && !path.contains('%') {
        return Ok(Cow::Borrowed(path));
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if byte != b'%' {
            out.push(char::from(byte));
            at += 1;
            continue;
        }
        let escape = path.get(at..at + 3).unwrap_or(&path[at..]);
        let value = match (bytes.get(at + 1), bytes.get(at + 2)) {
            (Some(high), Some(low)) => hex_digit(*high)
                .zip(hex_digit(*low))
                .map(|(high, low)| high * 16 + low),
            _ => None,
        };
        match value {
            Some(value) if unreserved(value) => out.push(char::from(value)),
            _ => {
                return Err(format!(
                    "the path must not percent-encode anything but letters, digits and \
                     - . _ ~ (found {escape:?})"
                ))
            }
        }
        at += 3;
    }
    Ok(Cow::Owned(out))
}

/// The canonical form of a request path (without its query), or the
/// reason it is refused. `Ok(None)`: the path is canonical already —
/// found without allocating when nothing was decoded and no segment
/// changes.
pub fn canonical(path: &str) -> Result<Option<String>, String> {
    // An `http::Uri` path is ASCII: anything else arrives escaped.
    let decoded = decoded(path)?;
    let mut buffer = Uuid::encode_buffer();
    let mut unchanged = matches!(decoded, Cow::Borrowed(_));
    for segment in decoded.split('/') {
        unchanged &= canonical_segment(segment, &mut buffer)? == segment;
    }
    if unchanged {
        return Ok(None);
    }
    let mut segments = Vec::new();
    for segment in decoded.split('/') {
        segments.push(canonical_segment(segment, &mut buffer)?.to_owned());
    }
    let canonical = segments.join("/");
    Ok((canonical != path).then_some(canonical))
}

/// One segment as the router reads it (the rules above): a `.` or `..`
/// segment is refused, a UUID (32 or 36 hex digits and hyphens that parse
/// as one) is written lower case and hyphenated into `buffer`, any other
/// spelling of a UUID (braces, `urn:uuid:`) is refused, anything else is
/// itself.
fn canonical_segment<'s>(segment: &'s str, buffer: &'s mut [u8; 45]) -> Result<&'s str, String> {
    if segment == "." || segment == ".." {
        return Err("the path must not hold `.` or `..` segments".into());
    }
    let is_id = matches!(segment.len(), 32 | 36)
        && segment.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    match Uuid::try_parse(segment) {
        Ok(id) if is_id => Ok(id.hyphenated().encode_lower(buffer)),
        // Braces, a `urn:uuid:` prefix: a spelling of an id that the
        // extractors would read, but the API's ids have one form. Refused,
        // so that no check is ever made against a spelling it missed.
        Ok(_) => Err(format!(
            "an id in the path is written as 32 hex digits, hyphenated 8-4-4-4-12 \
             (found {segment:?})"
        )),
        Err(_) => Ok(segment),
    }
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn a_canonical_path_is_found_unchanged_and_any_other_is_not() {
        let id = "0e2a3f5c-1b2c-4d5e-8f90-a1b2c3d4e5f6";
        let canonical_paths = [
            "/v1/me".to_owned(),
            "/".to_owned(),
            String::new(),
            "/v1/accounts//x".to_owned(),
            format!("/v1/accounts/{id}/jobs"),
            format!("/v1/accounts/{}", &id[..35]),
            format!("/v1/accounts/{id}x"),
            "/v1/accounts/0e2a3f5c-1b2c-4d5e-8f90-a1b2c3d4e5fZ".to_owned(),
            "/v1/accounts/------------------------------------".to_owned(),
            "/static/ABCDEF".to_owned(),
            "/v1/.../me".to_owned(),
        ];
        for path in &canonical_paths {
            assert_eq!(canonical(path), Ok(None), "{path}");
        }
        let other_paths = [
            format!("/v1/accounts/{}/jobs", id.to_ascii_uppercase()),
            format!("/v1/accounts/{}", id.replace('-', "")),
            "/v1/%61ccounts".to_owned(),
            "/v1/../v1/me".to_owned(),
            "/v1/./me".to_owned(),
            "/v1/caf\u{e9}".to_owned(),
        ];
        for path in &other_paths {
            assert_ne!(canonical(path), Ok(None), "{path}");
        }
    }

    #[test]
    fn unreserved_escapes_are_decoded_and_ids_lower_cased() {
        assert_eq!(canonical("/v1/me"), Ok(None));
        assert_eq!(canonical("/%761/me"), Ok(Some("/v1/me".into())));
        assert_eq!(canonical("/v1/%61ccounts"), Ok(Some("/v1/accounts".into())));
        assert_eq!(canonical("/v1/%7e%2D%2e%5F"), Ok(Some("/v1/~-._".into())));
        let id = "0E2A3F5C-1B2C-4D5E-8F90-A1B2C3D4E5F6";
        assert_eq!(
            canonical(&format!("/v1/accounts/{id}/jobs")),
            Ok(Some(format!(
                "/v1/accounts/{}/jobs",
                id.to_ascii_lowercase()
            )))
        );
        assert_eq!(
            canonical("/v1/accounts/0e2a3f5c1b2c4d5e8f90a1b2c3d4e5f6"),
            Ok(Some(
                "/v1/accounts/0e2a3f5c-1b2c-4d5e-8f90-a1b2c3d4e5f6".into()
            ))
        );
        // Hex-looking words that are not ids stay as they are.
        assert_eq!(canonical("/static/ABCDEF"), Ok(None));
    }

    #[test]
    fn braced_and_urn_ids_are_refused() {
        let id = "0e2a3f5c-1b2c-4d5e-8f90-a1b2c3d4e5f6";
        for path in [
            format!("/v1/accounts/{{{id}}}/ledger"),
            format!("/v1/accounts/urn:uuid:{id}/ledger"),
            format!("/v1/accounts/{id}/reservations/{{{id}}}"),
        ] {
            assert!(canonical(&path).is_err(), "{path}");
        }
    }

    #[test]
    fn other_escapes_and_dot_segments_are_refused() {
        for refused in [
            "/v1/accounts%2Fx",
            "/v1/%2e%2e/v1/me",
            "/v1/%25",
            "/v1/%00",
            "/v1/%C3%A9",
            "/v1/%",
            "/v1/%7",
            "/v1/%zz",
            "/v1/../v1/me",
            "/v1/./me",
        ] {
            assert!(canonical(refused).is_err(), "{refused}");
        }
    }
}
