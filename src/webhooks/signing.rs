//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>):
//! secrets `whsec_<base64 key>`, headers `webhook-id`, `webhook-timestamp`
//! and `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`,
//! space-separated when more than one secret signs (a rotation).
//!
//! Receivers verify with any Standard Webhooks library; the tests use the
//! `standardwebhooks` package from PyPI, which shares nothing with this code.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

/// The prefix of every endpoint secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// Bytes of key material in a new secret (the spec allows 24 to 64).
const SECRET_BYTES: usize = 32;

/// A new random secret, `whsec_` + base64 of 32 random bytes.
pub fn new_secret() -> SecretString {
    let mut key = [0u8; SECRET_BYTES];
    rand::thread_rng().fill_bytes(&mut key);
    SecretString::from(format!("{SECRET_PREFIX}{}", STANDARD.encode(key)))
}

/// The HMAC key of a secret: the base64 after `whsec_`.
fn key_of(secret: &SecretString) -> Option<Vec<u8>> {
    let encoded = secret.expose_secret().strip_prefix(SECRET_PREFIX)?;
    STANDARD.decode(encoded).ok()
}

/// `v1,<signature>` for one secret; `None` for a malformed secret (never
/// stored: secrets are made by [`new_secret`]).
fn sign_one(secret: &SecretString, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = key_of(secret)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// The `webhook-signature` header value: one `v1,` signature per secret,
/// space-separated.
pub fn signature_header(
    secrets: &[&SecretString],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .iter()
        .filter_map(|secret| sign_one(secret, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks reference implementations
    /// (their test suites sign this message with this secret).
    #[test]
    fn matches_the_specification_example() {
        let secret = SecretString::from("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned());
        let header = signature_header(
            &[&secret],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(header, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn one_signature_per_secret_and_fresh_secrets_differ() {
        let (first, second) = (new_secret(), new_secret());
        assert_ne!(first.expose_secret(), second.expose_secret());
        assert!(first.expose_secret().starts_with(SECRET_PREFIX));
        let header = signature_header(&[&first, &second], "evt", 1, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|part| part.starts_with("v1,")));
        assert_ne!(parts[0], parts[1]);
    }
}
