//! Where a webhook may be sent. A URL whose host is, or resolves to, a
//! loopback, private, link-local (cloud metadata lives there),
//! unspecified, multicast, shared (CGNAT) or documentation address is
//! refused, unless `WEBHOOK_ALLOW_PRIVATE_URLS=true` (development, tests).
//! The rule is applied twice: when an endpoint is created or changed (a
//! clear 400), and at every connection, by the HTTP client's resolver
//! ([`GuardedResolver`]), so a name that later resolves elsewhere (DNS
//! rebinding) is refused too.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

/// Longest endpoint URL.
pub const URL_LENGTH_MAX: usize = 2_000;
/// How long the check of a new URL waits for its name to resolve.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `address` is one a webhook may reach from the public internet.
///
/// One rule for every spelling: an IPv6 address that carries an IPv4
/// address (IPv4-mapped `::ffff:a.b.c.d`, IPv4-translated
/// `::ffff:0:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`,
/// 6to4 `2002::/16`, Teredo `2001::/32`) is judged by that IPv4 address,
/// so `[::127.0.0.1]`, `[::a9fe:a9fe]` or `[2002:7f00:1::]` are the
/// loopback and metadata addresses they lead to.
pub fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match embedded_ipv4(v6) {
            Some(Embedded::One(v4)) => is_public_v4(v4),
            Some(Embedded::Teredo { server, client }) => {
                is_public_v4(server) && is_public_v4(client)
            }
            None => is_public_v6(v6),
        },
    }
}

/// The IPv4 address(es) an IPv6 address stands for, if it is one of the
/// forms that carry one.
#[derive(Debug, PartialEq, Eq)]
enum Embedded {
    One(Ipv4Addr),
    /// RFC 4380: the Teredo server, and the client's public address (its
    /// last 32 bits, inverted). Either could be where a packet goes.
    Teredo {
        server: Ipv4Addr,
        client: Ipv4Addr,
    },
}

fn embedded_ipv4(v6: Ipv6Addr) -> Option<Embedded> {
    let segments = v6.segments();
    let octets = v6.octets();
    let last_32 = Ipv4Addr::new(octets[12], octets[13], octets[14], octets[15]);
    match segments {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated, RFC 2765)
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => {
            Some(Embedded::One(last_32))
        }
        // ::a.b.c.d (IPv4-compatible, deprecated by RFC 4291), which also
        // covers :: and ::1 (0.0.0.0 and 0.0.0.1, neither public)
        [0, 0, 0, 0, 0, 0, _, _] => Some(Embedded::One(last_32)),
        // 64:ff9b::/96, the well-known NAT64 prefix (RFC 6052)
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(Embedded::One(last_32)),
        // 2002:AABB:CCDD::/48, 6to4 (RFC 3056)
        [0x2002, high, low, ..] => Some(Embedded::One(Ipv4Addr::from(
            (u32::from(high) << 16) | u32::from(low),
        ))),
        // 2001:0000:SSSS:SSSS:flags:port:CCCC:CCCC, Teredo (RFC 4380)
        [0x2001, 0, high, low, ..] => Some(Embedded::Teredo {
            server: Ipv4Addr::from((u32::from(high) << 16) | u32::from(low)),
            client: Ipv4Addr::from(!u32::from(last_32)),
        }),
        _ => None,
    }
}

/// IPv6 without an embedded IPv4 address: not public when the IANA IPv6
/// Special-Purpose Address Registry says it is not globally reachable (as
/// the standard library's unstable `Ipv6Addr::is_global` encodes it), or
/// when it is multicast or site-local.
fn is_public_v6(v6: Ipv6Addr) -> bool {
    let segments = v6.segments();
    !(v6.is_loopback()
        || v6.is_unspecified()
        || v6.is_multicast()
        // 64:ff9b:1::/48 local-use IPv4/IPv6 translation (RFC 8215)
        || (segments[0] == 0x64 && segments[1] == 0xff9b && segments[2] == 1)
        // 100::/64 discard-only
        || (segments[0] == 0x100 && segments[1] == 0 && segments[2] == 0 && segments[3] == 0)
        // 2001::/23 IETF protocol assignments (benchmarking 2001:2::/48,
        // ORCHID, …); Teredo, inside it, is judged above
        || (segments[0] == 0x2001 && segments[1] < 0x200)
        // 2001:db8::/32 and 3fff::/20 documentation
        || (segments[0] == 0x2001 && segments[1] == 0xdb8)
        || (segments[0] == 0x3fff && segments[1] < 0x1000)
        // 5f00::/16 segment routing (SRv6) SIDs
        || segments[0] == 0x5f00
        // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local
        || (segments[0] & 0xfe00) == 0xfc00
        || (segments[0] & 0xffc0) == 0xfe80
        || (segments[0] & 0xffc0) == 0xfec0)
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

/// A webhook URL as the audit log, the event feed and every other place
/// but the endpoint itself show it: scheme, host and port only. A
/// receiver's URL is often its credential — a token in the query
/// (`?token=…`), the path (`/services/T000/B000/<secret>`) or, refused
/// here but possible in old rows, userinfo — so everything after the
/// authority becomes `/[redacted]`. Idempotent; a text that is no URL
/// becomes `[redacted]`.
pub fn redacted(url: &str) -> String {
    crate::secrets::redact_url(url)
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

    /// Every spelling of an address, judged the same. The non-public
    /// ranges are the IANA IPv4 and IPv6 Special-Purpose Address Registries
    /// as the standard library's `is_global` (unstable) encodes them, with
    /// the examples of its documentation; the IPv6 forms that carry an
    /// IPv4 address are those of RFC 4291 (mapped, compatible), RFC 2765
    /// (translated), RFC 6052 (NAT64), RFC 3056 (6to4) and RFC 4380
    /// (Teredo), each written around a private and a public IPv4 address.
    const FORMS: &[(&str, bool)] = &[
        // IPv4 (std's `Ipv4Addr::is_global` examples and the registry)
        ("80.9.12.3", true),
        ("1.1.1.1", true),
        ("93.184.215.14", true),
        ("0.0.0.0", false),
        ("0.1.2.3", false),
        ("10.254.0.0", false),
        ("172.16.10.65", false),
        ("192.168.10.65", false),
        ("100.100.0.0", false),
        ("127.0.0.1", false),
        ("127.1.2.3", false),
        ("169.254.45.1", false),
        ("169.254.169.254", false),
        ("192.0.0.8", false),
        ("192.0.2.255", false),
        ("198.51.100.65", false),
        ("203.0.113.6", false),
        ("198.18.0.0", false),
        ("250.10.20.30", false),
        ("255.255.255.255", false),
        ("224.0.0.1", false),
        // IPv6 (std's `Ipv6Addr::is_global` examples and the registry)
        ("26:0:1c9::afc8:10:1", true),
        ("2606:4700:4700::1111", true),
        ("::", false),
        ("::1", false),
        ("100::1", false),
        ("2001:2::1", false),
        ("2001:db8::1", false),
        ("3fff::", false),
        ("3fff:fff::1", false),
        ("5f00::1", false),
        ("fc02::1", false),
        ("fd00:ec2::254", false),
        ("fe81::1", false),
        ("fec0::1", false),
        ("ff02::1", false),
        ("64:ff9b:1::a9fe:a9fe", false),
        // IPv4-mapped
        ("::ffff:127.0.0.1", false),
        ("::ffff:7f00:1", false),
        ("::ffff:169.254.169.254", false),
        ("::ffff:c00a:2ff", true),
        ("::ffff:1.1.1.1", true),
        // IPv4-translated (RFC 2765)
        ("::ffff:0:127.0.0.1", false),
        ("::ffff:0:1.1.1.1", true),
        // IPv4-compatible
        ("::127.0.0.1", false),
        ("::7f00:1", false),
        ("::a9fe:a9fe", false),
        ("::10.0.0.1", false),
        ("::1.1.1.1", true),
        // NAT64, well-known prefix
        ("64:ff9b::7f00:1", false),
        ("64:ff9b::a9fe:a9fe", false),
        ("64:ff9b::1.1.1.1", true),
        // 6to4
        ("2002:7f00:1::", false),
        ("2002:a9fe:a9fe::1", false),
        ("2002:c0a8:101::1", false),
        ("2002:101:101::1", true),
        // Teredo: server 65.54.227.120; client 127.0.0.1 / 1.1.1.1 inverted
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", false),
        ("2001:0:4136:e378:8000:63bf:fefe:fefe", true),
        // Teredo with a private server
        ("2001:0:a00:1:8000:63bf:fefe:fefe", false),
    ];

    #[test]
    fn every_spelling_of_an_address_gets_one_answer() {
        for (text, public) in FORMS {
            let address: IpAddr = text.parse().expect("address");
            assert_eq!(is_public(address), *public, "{text}");
        }
    }

    #[test]
    fn embedded_addresses_are_read_right() {
        let v6 = |text: &str| text.parse::<Ipv6Addr>().expect("address");
        let v4 = |text: &str| text.parse::<Ipv4Addr>().expect("address");
        assert_eq!(
            embedded_ipv4(v6("2002:7f00:1::")),
            Some(Embedded::One(v4("127.0.0.1")))
        );
        assert_eq!(
            embedded_ipv4(v6("::a9fe:a9fe")),
            Some(Embedded::One(v4("169.254.169.254")))
        );
        assert_eq!(
            embedded_ipv4(v6("2001:0:4136:e378:8000:63bf:80ff:fffe")),
            Some(Embedded::Teredo {
                server: v4("65.54.227.120"),
                client: v4("127.0.0.1"),
            })
        );
        assert_eq!(embedded_ipv4(v6("2606:4700:4700::1111")), None);
    }

    #[test]
    fn redaction_keeps_only_scheme_host_and_port() {
        for (url, shown) in [
            (
                "https://hooks.example.com/services/T000/B000/SECRET?token=qs-secret-123",
                "https://hooks.example.com/[redacted]",
            ),
            (
                "https://user:pass@example.com:8443/",
                "https://example.com:8443/[redacted]",
            ),
            (
                "http://[::1]:9000/hook#frag",
                "http://[::1]:9000/[redacted]",
            ),
            ("https://example.com/", "https://example.com/"),
            ("https://example.com", "https://example.com/"),
            (
                "https://example.com/[redacted]",
                "https://example.com/[redacted]",
            ),
            ("not a url", "[redacted]"),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
            assert_eq!(redacted(&redacted(url)), redacted(url), "idempotent: {url}");
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
            // The spellings of the issue that once got through.
            ("http://[::127.0.0.1]/", "non-public"),
            ("http://[::a9fe:a9fe]/latest/meta-data", "non-public"),
            ("http://[2002:7f00:1::]/", "non-public"),
            ("http://[64:ff9b::a9fe:a9fe]/", "non-public"),
            (
                "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",
                "non-public",
            ),
            // IPv4 spellings that the URL parser brings back to 127.0.0.1.
            ("http://2130706433/", "non-public"),
            ("http://0x7f.1/", "non-public"),
            ("http://127.1/", "non-public"),
        ] {
            let error = check_url(url, false).await.expect_err(url);
            assert!(error.contains(fragment), "{url}: {error}");
        }
        assert!(check_url("http://127.0.0.1:8080/hook", true).await.is_ok());
    }
}
