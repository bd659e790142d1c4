//! Where a webhook may be sent. A URL whose host is, or resolves to, a
//! loopback, private, link-local (cloud metadata lives there),
//! unspecified, multicast, shared (CGNAT) or documentation address is
//! refused, unless `WEBHOOK_ALLOW_PRIVATE_URLS=true` (development, tests).
//! The rule is applied twice: when an endpoint is created or changed (a
//! clear 400), and at every connection, by the HTTP client's resolver
//! ([`GuardedResolver`]), so a name that later resolves elsewhere (DNS
//! rebinding) is refused too.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

/// Longest endpoint URL.
pub const URL_LENGTH_MAX: usize = 2_000;
/// How long the check of a new URL waits for its name to resolve.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `address` is one a webhook may reach from the public internet.
pub fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let segments = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // fc00::/7 unique local, fe80::/10 link-local
                || (segments[0] & 0xfe00) == 0xfc00
                || (segments[0] & 0xffc0) == 0xfe80
                // 64:ff9b::/96 NAT64 of any IPv4, 2001:db8::/32 documentation
                || (segments[0] == 0x64 && segments[1] == 0xff9b)
                || (segments[0] == 0x2001 && segments[1] == 0xdb8))
        }
    }
}

fn is_public_v4(v4: Ipv4Addr) -> bool {
    let [a, b, ..] = v4.octets();
    !(v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_broadcast()
        || v4.is_multicast()
        || v4.is_documentation()
        || a == 0
        // 100.64.0.0/10 shared address space (CGNAT)
        || (a == 100 && (64..128).contains(&b))
        // 192.0.0.0/24 protocol assignments, 198.18.0.0/15 benchmarking,
        // 240.0.0.0/4 reserved
        || (a == 192 && b == 0 && v4.octets()[2] == 0)
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

/// Checks an endpoint URL as given by an admin: http(s), a host, no
/// credentials, no fragment, not too long; and, unless private URLs are
/// allowed, a host that resolves only to public addresses. The error is
/// the message for the 400 answer.
pub async fn check_url(text: &str, allow_private: bool) -> Result<Url, String> {
    if text.len() > URL_LENGTH_MAX {
        return Err(format!("url must be at most {URL_LENGTH_MAX} characters"));
    }
    let url = Url::parse(text).map_err(|error| format!("url is not a valid URL: {error}"))?;
    if !matches!(url.scheme(), "https" | "http") {
        return Err("url must be an http:// or https:// URL".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("url must not contain credentials; the signature authenticates us".into());
    }
    if url.fragment().is_some() {
        return Err("url must not contain a fragment".into());
    }
    let Some(host) = url.host_str() else {
        return Err("url must name a host".into());
    };
    if allow_private {
        return Ok(url);
    }
    let port = url.port_or_known_default().unwrap_or(443);
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let lookup = tokio::net::lookup_host((host.as_str(), port));
    let addresses: Vec<SocketAddr> = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
        .await
        .map_err(|_| format!("url's host {host:?} did not resolve within {RESOLVE_TIMEOUT:?}"))?
        .map_err(|_| format!("url's host {host:?} does not resolve"))?
        .collect();
    if addresses.is_empty() {
        return Err(format!("url's host {host:?} does not resolve"));
    }
    if let Some(address) = addresses.iter().find(|address| !is_public(address.ip())) {
        return Err(format!(
            "url's host {host:?} resolves to {}, a loopback, private, link-local or otherwise \
             non-public address; webhooks are sent to public addresses only \
             (WEBHOOK_ALLOW_PRIVATE_URLS=true allows others, for development)",
            address.ip()
        ));
    }
    Ok(url)
}

/// The delivery client's resolver: the system's, with every non-public
/// address dropped (an error when none is left), so the guard holds at
/// connection time whatever the name resolves to by then.
pub struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|address| is_public(address.ip()))
                .collect();
            if resolved.is_empty() {
                return Err(format!("{host} resolves to no public address").into());
            }
            let addresses: Addrs = Box::new(resolved.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_and_special_addresses_are_not_public() {
        for text in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            let address: IpAddr = text.parse().expect("address");
            assert!(!is_public(address), "{text} must not be public");
        }
        for text in ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111"] {
            let address: IpAddr = text.parse().expect("address");
            assert!(is_public(address), "{text} must be public");
        }
    }

    #[tokio::test]
    async fn urls_are_checked() {
        for (url, fragment) in [
            ("ftp://example.com/x", "http:// or https://"),
            ("https://user:pw@example.com/", "credentials"),
            ("not a url", "not a valid URL"),
            ("http://127.0.0.1:8080/hook", "non-public"),
            ("http://[::1]/hook", "non-public"),
            ("http://169.254.169.254/latest/meta-data", "non-public"),
            ("http://localhost/hook", "non-public"),
        ] {
            let error = check_url(url, false).await.expect_err(url);
            assert!(error.contains(fragment), "{url}: {error}");
        }
        assert!(check_url("http://127.0.0.1:8080/hook", true).await.is_ok());
    }
}
