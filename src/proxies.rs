//! The client's address behind reverse proxies (issue 32): the TCP peer,
//! unless that peer is one of `MNEMOSYNE_TRUSTED_PROXIES` — then the hop its
//! `Forwarded` (RFC 7239 `for=`) or `X-Forwarded-For` header records. Only
//! the hops trusted proxies appended are believed: the list is read from the
//! right, and the first hop that is not a trusted proxy is the client (what a
//! client writes into the header itself sits to the left of it and is never
//! used). Per-address throttles key on [`rate_key`], which groups IPv6 by /64
//! (one subscriber's prefix) so rotating addresses within it gains nothing.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use http::HeaderMap;

/// An address block (`10.0.0.0/8`, `2001:db8::/32`; a bare address is the
/// block of that one address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        let s = raw.trim();
        let bad = || format!("{raw:?} is not an address block (e.g. 10.0.0.0/8, 2001:db8::/32, 192.0.2.7)");
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u8>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let net = canonical(addr.parse::<IpAddr>().map_err(|_| bad())?);
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(bad());
        }
        Ok(Cidr {
            net: mask(net, prefix),
            prefix,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl Cidr {
    /// Whether `ip` is inside this block (IPv4-mapped IPv6 counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.net.is_ipv4() && mask(ip, self.prefix) == self.net
    }
}

/// `MNEMOSYNE_TRUSTED_PROXIES`: address blocks, comma-separated; empty
/// entries (and an empty value) are no block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies(pub Vec<Cidr>);

impl FromStr for TrustedProxies {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        raw.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Cidr::from_str)
            .collect::<Result<_, _>>()
            .map(TrustedProxies)
    }
}

/// `::ffff:a.b.c.d` as the IPv4 address it is (dual-stack listeners see it).
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix.min(32))
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix.min(128))
            };
            IpAddr::V6((bits & m).into())
        }
    }
}

/// The client's address of a request, as the accept loop resolved it (an
/// extension of every request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientAddress(pub IpAddr);

/// The key per-address throttles count under: an IPv4 address, or the /64
/// an IPv6 address is in (`2001:db8:1:2::/64`).
pub fn rate_key(ip: IpAddr) -> String {
    match canonical(ip) {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let net = Ipv6Addr::from(u128::from(v6) & (u128::MAX << 64));
            format!("{net}/64")
        }
    }
}

/// Which header the trusted proxies write the client's address into
/// (`MNEMOSYNE_FORWARDED_HEADER`): only that one is read. HAProxy's
/// `option forwardfor` (what `deploy/` configures) appends to
/// `X-Forwarded-For`; a proxy that writes RFC 7239 `Forwarded` instead is
/// configured as `forwarded`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardedHeader {
    #[default]
    #[value(name = "x-forwarded-for")]
    XForwardedFor,
    #[value(name = "forwarded")]
    Forwarded,
}

/// The client's address: `peer` itself unless it is trusted; then the
/// rightmost hop of the one forwarding header the proxies write (`which`)
/// that is not a trusted proxy. The other header is never read: a client
/// that writes it beside the proxy's (issue 54: a `Forwarded` of the
/// client's own beside HAProxy's `X-Forwarded-For` made the two disagree,
/// and the request counted under the proxy's address, with everyone's)
/// changes nothing.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr], which: ForwardedHeader) -> IpAddr {
    let peer = canonical(peer);
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let hops = match which {
        ForwardedHeader::Forwarded => header_hops(headers, "forwarded", forwarded_for),
        ForwardedHeader::XForwardedFor => header_hops(headers, "x-forwarded-for", |v| {
            v.split(',').map(|h| parse_node(h.trim())).collect()
        }),
    };
    match hops {
        Some(h) => rightmost_untrusted(peer, &h, &is_trusted),
        None => peer,
    }
}

/// Every value of header `name`, in order, split into hops by `split`
/// (`None` for a hop without a usable address); `None` when absent.
fn header_hops(
    headers: &HeaderMap,
    name: &str,
    split: impl Fn(&str) -> Vec<Option<IpAddr>>,
) -> Option<Vec<Option<IpAddr>>> {
    let mut values = headers.get_all(name).iter().peekable();
    values.peek()?;
    Some(
        values
            .flat_map(|v| match v.to_str() {
                Ok(s) => split(s),
                // Bytes no proxy writes: one hop that is no address.
                Err(_) => vec![None],
            })
            .collect(),
    )
}

/// Walks `hops` from the right past trusted proxies. A hop that is no
/// address (`unknown`, an obfuscated name) ends the walk at the trusted hop
/// after it: nothing to its left can be checked.
fn rightmost_untrusted(peer: IpAddr, hops: &[Option<IpAddr>], is_trusted: &impl Fn(IpAddr) -> bool) -> IpAddr {
    let mut last_trusted = peer;
    for hop in hops.iter().rev() {
        match hop {
            Some(ip) if is_trusted(*ip) => last_trusted = *ip,
            Some(ip) => return *ip,
            None => return last_trusted,
        }
    }
    // Every hop is a trusted proxy: the leftmost one is the client.
    last_trusted
}

/// The `for=` of each element of a `Forwarded` value (RFC 7239 §4).
fn forwarded_for(value: &str) -> Vec<Option<IpAddr>> {
    split_outside_quotes(value, ',')
        .into_iter()
        .map(|element| {
            split_outside_quotes(element, ';')
                .into_iter()
                .find_map(|pair| {
                    let (k, v) = pair.split_once('=')?;
                    k.trim().eq_ignore_ascii_case("for").then(|| parse_node(v.trim()))
                })
                .flatten()
        })
        .collect()
}

fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let (mut out, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            out.push(&s[start..i]);
            start = i + 1;
        }
    }
    out.push(&s[start..]);
    out
}

/// A node as proxies write it: `192.0.2.43`, `192.0.2.43:47011`,
/// `"[2001:db8::1]:4711"`, `2001:db8::1`; anything else is `None`.
fn parse_node(raw: &str) -> Option<IpAddr> {
    let s = raw.trim().trim_matches('"');
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, _) = rest.split_once(']')?;
        return addr.parse::<Ipv6Addr>().ok().map(|a| canonical(IpAddr::V6(a)));
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    let (addr, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    addr.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter().map(|c| c.parse().unwrap()).collect()
    }

    #[test]
    fn blocks_parse_and_contain() {
        let c: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert!(c.contains(ip("10.200.0.1")) && !c.contains(ip("11.0.0.1")));
        assert!(c.contains(ip("::ffff:10.0.0.9")), "IPv4-mapped IPv6 is IPv4");
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        for bad in ["", "10.0.0.0/33", "::/129", "10.0.0/8", "example.com", "10.0.0.0/x"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_setting_is_a_list_and_empty_is_none() {
        assert_eq!("".parse::<TrustedProxies>().unwrap(), TrustedProxies::default());
        let l: TrustedProxies = " 10.0.0.0/8, ,fd00::/8 ".parse().unwrap();
        assert_eq!(l.0, cidrs(&["10.0.0.0/8", "fd00::/8"]));
        assert!("10.0.0.0/8,nope".parse::<TrustedProxies>().is_err());
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let h = headers(&[("x-forwarded-for", "203.0.113.9"), ("forwarded", "for=203.0.113.9")]);
        for which in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
            assert_eq!(client_ip(ip("198.51.100.1"), &h, &[], which), ip("198.51.100.1"));
            let trusted = cidrs(&["10.0.0.0/8"]);
            assert_eq!(client_ip(ip("198.51.100.1"), &h, &trusted, which), ip("198.51.100.1"));
        }
    }

    #[test]
    fn the_rightmost_untrusted_hop_of_a_trusted_peer_is_the_client() {
        let trusted = cidrs(&["10.0.0.0/8", "fd00::/8"]);
        let proxy = ip("10.0.0.2");
        let table: &[(&[(&str, &str)], &str)] = &[
            (&[("x-forwarded-for", "203.0.113.9")], "203.0.113.9"),
            // What the client wrote is to the left of what the proxy appended.
            (&[("x-forwarded-for", "1.2.3.4, 203.0.113.9")], "203.0.113.9"),
            // A chain of trusted proxies is walked past.
            (&[("x-forwarded-for", "1.2.3.4, 203.0.113.9, 10.0.0.7")], "203.0.113.9"),
            (
                &[("x-forwarded-for", "1.2.3.4"), ("x-forwarded-for", "203.0.113.9")],
                "203.0.113.9",
            ),
            (
                &[("forwarded", "for=192.0.2.60;proto=http;by=203.0.113.43")],
                "192.0.2.60",
            ),
            (
                &[("forwarded", "for=1.2.3.4, for=\"[2001:db8:cafe::17]:4711\"")],
                "2001:db8:cafe::17",
            ),
            (&[("forwarded", "for=\"192.0.2.43:47011\", for=10.9.9.9")], "192.0.2.43"),
            // `unknown` or an obfuscated node: the trusted hop after it.
            (&[("x-forwarded-for", "203.0.113.9, unknown, 10.0.0.7")], "10.0.0.7"),
            (&[("forwarded", "for=_hidden")], "10.0.0.2"),
            (&[("x-forwarded-for", "")], "10.0.0.2"),
            // Every hop trusted: the leftmost.
            (&[("x-forwarded-for", "10.0.0.9, 10.0.0.7")], "10.0.0.9"),
            // Only the configured header is read: a client's own other
            // header beside it changes nothing.
            (
                &[("forwarded", "for=1.2.3.4"), ("x-forwarded-for", "203.0.113.9")],
                "203.0.113.9",
            ),
            (&[], "10.0.0.2"),
        ];
        let is_forwarded = |h: &[(&str, &str)]| h.iter().any(|(k, _)| *k == "forwarded");
        for (h, want) in table {
            // X-Forwarded-For configured (the default): `Forwarded` rows are
            // the proxy's own address unless they carry X-Forwarded-For too.
            let xff_only = !h.iter().any(|(k, _)| *k == "x-forwarded-for");
            let want_xff = if is_forwarded(h) && xff_only { "10.0.0.2" } else { want };
            assert_eq!(
                client_ip(proxy, &headers(h), &trusted, ForwardedHeader::XForwardedFor),
                ip(want_xff),
                "{h:?}"
            );
        }
        // `Forwarded` configured: the same walk over it, X-Forwarded-For ignored.
        let forwarded: &[(&[(&str, &str)], &str)] = &[
            (
                &[("forwarded", "for=192.0.2.60;proto=http;by=203.0.113.43")],
                "192.0.2.60",
            ),
            (&[("forwarded", "for=\"192.0.2.43:47011\", for=10.9.9.9")], "192.0.2.43"),
            (&[("forwarded", "for=_hidden")], "10.0.0.2"),
            (
                &[("forwarded", "for=203.0.113.9"), ("x-forwarded-for", "1.2.3.4")],
                "203.0.113.9",
            ),
            (&[("x-forwarded-for", "203.0.113.9")], "10.0.0.2"),
        ];
        for (h, want) in forwarded {
            assert_eq!(
                client_ip(proxy, &headers(h), &trusted, ForwardedHeader::Forwarded),
                ip(want),
                "{h:?}"
            );
        }
    }

    #[test]
    fn rate_keys_group_ipv6_by_64() {
        assert_eq!(rate_key(ip("192.0.2.1")), "192.0.2.1");
        assert_eq!(rate_key(ip("::ffff:192.0.2.1")), "192.0.2.1");
        assert_eq!(rate_key(ip("2001:db8:1:2:aaaa::1")), "2001:db8:1:2::/64");
        assert_eq!(rate_key(ip("2001:db8:1:2:bbbb::9")), "2001:db8:1:2::/64");
        assert_ne!(rate_key(ip("2001:db8:1:3::1")), rate_key(ip("2001:db8:1:2::1")));
    }
}
