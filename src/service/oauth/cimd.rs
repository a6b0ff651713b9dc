//! Client ID Metadata Documents (draft-ietf-oauth-client-id-metadata-document,
//! the MCP authorization spec's preferred way for a client to introduce
//! itself): a `client_id` that is an `https://` URL names a JSON document,
//! served there by the client's publisher, that is the client's
//! registration. This module fetches, checks and caches those documents.
//!
//! Fetching a URL a stranger names is a server-side request forgery risk,
//! so a fetch is fenced in:
//!
//! - **https only**, on a URL in normal form with a path, no fragment and no
//!   credentials. Plain `http` (on a loopback host) is accepted only while
//!   this server itself runs on a loopback `http` public URL (development).
//! - **Public addresses only**: the host is resolved once, every address it
//!   resolves to must be public (loopback, private, CGNAT, link-local,
//!   unique-local, multicast, unspecified, documentation and other reserved
//!   ranges are refused, IPv4-mapped and other v4-embedding IPv6 forms by
//!   their IPv4 address), and the connection goes to exactly the addresses
//!   checked (reqwest's `resolve_to_addrs`), so a second DNS answer cannot
//!   swap in another (DNS rebinding). Development adds loopback.
//! - **No redirects** (a 3xx is a refusal), no proxy, HTTP/1.1.
//! - **Caps**: [`FETCH_TIMEOUT`] for the whole fetch (resolution, connection,
//!   headers, body), [`MAX_BODY`] read incrementally and abandoned past it.
//! - **Only a 200 with a JSON content type.**
//! - **A cache** (moka, per replica): a document for its `Cache-Control`
//!   `max-age` clamped to [`MIN_TTL`]–[`MAX_TTL`] ([`DEFAULT_TTL`] without
//!   one; `no-store`/`no-cache` get the minimum), a refusal for
//!   [`FAILURE_TTL`], so a bad URL cannot make this server fetch on every
//!   request; concurrent requests for one URL share one fetch.
//! - **TLS**: rustls with the webpki roots (plus the authorities of
//!   `MNEMOSYNE_OAUTH_METADATA_CA_FILE`, for a private CA or a test).
//! - **A rate** of fetches (cache misses) per requesting address, like
//!   dynamic registration's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, ACCEPT, CACHE_CONTROL, CONTENT_TYPE};
use reqwest::Url;
use serde_json::{json, Value};

use crate::limits::RateLimits;

/// The whole fetch: resolution, connection, answer and body.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest document read.
pub const MAX_BODY: usize = 64 * 1024;
/// Longest client_id URL (the column's limit).
pub const MAX_URL_LEN: usize = 2048;
/// How long a document is kept when its answer says nothing.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// The shortest a document is kept (whatever its `Cache-Control`).
pub const MIN_TTL: Duration = Duration::from_secs(300);
/// The longest a document is kept (whatever its `Cache-Control`).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a refused document is remembered.
pub const FAILURE_TTL: Duration = Duration::from_secs(60);
/// Documents kept per replica.
const CACHE_ENTRIES: u64 = 10_000;

/// Whether a `client_id` names a metadata document (rather than a client
/// registered here, whose ids are `mcl_…`).
pub fn is_document_url(client_id: &str) -> bool {
    let lower = client_id.get(..8).unwrap_or(client_id).to_ascii_lowercase();
    lower.starts_with("https://") || lower.starts_with("http://")
}

/// The rules of this deployment.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// This server runs on a loopback `http` public URL: documents may be
    /// served over http from loopback, and loopback addresses are fetched.
    pub dev: bool,
    /// The public URL is https: a document's redirect URIs follow the
    /// production rules of registration.
    pub production: bool,
}

fn is_loopback_name(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "[::1]" | "::1" | "localhost")
}

/// A client_id URL as the draft allows it: https (http on loopback in
/// development), in normal form, with a path, without fragment or
/// credentials.
pub fn check_url(raw: &str, dev: bool) -> Result<Url, String> {
    if raw.len() > MAX_URL_LEN {
        return Err(format!("a client_id URL is at most {MAX_URL_LEN} characters"));
    }
    let u = Url::parse(raw).map_err(|_| "the client_id is not a URL".to_owned())?;
    match u.scheme() {
        "https" => {}
        "http" if dev && is_loopback_name(u.host_str().unwrap_or("")) => {}
        "http" => return Err("a client_id URL must be https".into()),
        _ => return Err("a client_id URL must be https".into()),
    }
    if u.fragment().is_some() {
        return Err("a client_id URL has no fragment".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("a client_id URL has no user name or password".into());
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err("a client_id URL names a host".into());
    }
    if u.path() == "/" || u.path().is_empty() {
        return Err("a client_id URL has a path".into());
    }
    // Dot segments, an upper-case scheme or host, a default port written
    // out, unescaped characters: the URL is not the one it would be fetched
    // as, and the document's client_id must equal it exactly.
    if u.as_str() != raw {
        return Err(
            "the client_id URL is not in normal form (no dot segments, lower-case host, no default port)".into(),
        );
    }
    Ok(u)
}

// ---- addresses ----

/// What kind of address a host resolved to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressClass {
    Public,
    Loopback,
    /// RFC 1918, CGNAT (100.64/10), IPv6 site-local, NAT64 local use.
    Private,
    LinkLocal,
    /// IPv6 fc00::/7.
    UniqueLocal,
    Multicast,
    Unspecified,
    /// Broadcast, documentation, benchmarking, IETF assignments, 240/4,
    /// Teredo, the deprecated v4-compatible form, anything outside 2000::/3.
    Reserved,
}

impl AddressClass {
    pub fn label(self) -> &'static str {
        match self {
            AddressClass::Public => "public",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::LinkLocal => "link-local",
            AddressClass::UniqueLocal => "unique-local",
            AddressClass::Multicast => "multicast",
            AddressClass::Unspecified => "unspecified",
            AddressClass::Reserved => "reserved",
        }
    }
}

/// The class of an address; IPv6 forms that carry an IPv4 address
/// (mapped, NAT64, 6to4) are the class of that IPv4 address.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(a) => classify_v4(a),
        IpAddr::V6(a) => classify_v6(a),
    }
}

fn classify_v4(a: Ipv4Addr) -> AddressClass {
    use AddressClass::*;
    let o = a.octets();
    if o[0] == 0 {
        Unspecified // 0.0.0.0/8, "this network"
    } else if a.is_loopback() {
        Loopback
    } else if a.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64) {
        Private
    } else if a.is_link_local() {
        LinkLocal
    } else if a.is_multicast() {
        Multicast
    } else if o[0] >= 240
        || (o[0], o[1], o[2]) == (192, 0, 0)
        || (o[0], o[1], o[2]) == (192, 0, 2)
        || (o[0], o[1], o[2]) == (198, 51, 100)
        || (o[0], o[1], o[2]) == (203, 0, 113)
        || (o[0] == 198 && (o[1] & 0xfe) == 18)
    {
        Reserved
    } else {
        Public
    }
}

fn classify_v6(a: Ipv6Addr) -> AddressClass {
    use AddressClass::*;
    if let Some(v4) = a.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    let s = a.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if a.is_unspecified() {
        Unspecified
    } else if a.is_loopback() {
        Loopback
    } else if s[..6] == [0; 6] {
        Reserved // ::a.b.c.d, the deprecated v4-compatible form
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        classify_v4(embedded(s[6], s[7])) // NAT64 well-known prefix
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        Private // 64:ff9b:1::/48, NAT64 local use
    } else if s[0] == 0x2002 {
        classify_v4(embedded(s[1], s[2])) // 6to4
    } else if (s[0] & 0xfe00) == 0xfc00 {
        UniqueLocal
    } else if (s[0] & 0xffc0) == 0xfe80 {
        LinkLocal
    } else if (s[0] & 0xffc0) == 0xfec0 {
        Private // site-local (deprecated)
    } else if (s[0] & 0xff00) == 0xff00 {
        Multicast
    } else if (s[0] == 0x2001 && (s[1] < 0x0200 || s[1] == 0x0db8)) || (s[0] & 0xe000) != 0x2000 {
        // 2001::/23 (Teredo, benchmarking, ORCHID…), documentation, and
        // anything outside global unicast.
        Reserved
    } else {
        Public
    }
}

/// Whether a fetch may connect to an address of this class.
fn allowed(class: AddressClass, dev: bool) -> bool {
    class == AddressClass::Public || (dev && class == AddressClass::Loopback)
}

// ---- documents ----

/// A checked document: the client it registers.
#[derive(Clone, Debug)]
pub struct Document {
    /// Its URL.
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    /// The URL's host (and port when not the default), shown on the
    /// consent page.
    pub host: String,
    /// The registration kept with the client (the fields this server uses,
    /// as RFC 7591 would answer them).
    pub metadata: Value,
}

/// Why a document cannot be used.
#[derive(Debug)]
pub enum Refusal {
    /// The URL, its address, the answer or the document (the text says
    /// which; never an address).
    Invalid(String),
    /// Too many fetches from this requester: retry after this many seconds.
    RateLimited(u64),
}

#[derive(Clone)]
struct Entry {
    doc: Result<Arc<Document>, String>,
    ttl: Duration,
}

struct ByTtl;

impl moka::Expiry<String, Entry> for ByTtl {
    fn expire_after_create(&self, _url: &String, entry: &Entry, _at: Instant) -> Option<Duration> {
        Some(entry.ttl)
    }
}

/// The documents this replica fetched (and refused), and its fetch rate.
pub struct Documents {
    cache: moka::future::Cache<String, Entry>,
    fetches: RateLimits,
    /// Certificate authorities trusted besides the webpki roots.
    roots: Arc<[reqwest::Certificate]>,
}

impl Documents {
    /// `per_minute` fetches (cache misses) per requesting address over the
    /// deployment (0 = no limit), divided by the live `replicas`; `roots`
    /// are trusted besides the webpki roots.
    pub fn new(per_minute: u32, replicas: Arc<AtomicUsize>, roots: Vec<reqwest::Certificate>) -> Self {
        Documents {
            cache: moka::future::Cache::builder()
                .max_capacity(CACHE_ENTRIES)
                .expire_after(ByTtl)
                .build(),
            fetches: RateLimits::shared(per_minute, 0, replicas),
            roots: roots.into(),
        }
    }

    /// The document `url` names (from the cache, else fetched), and whether
    /// it was fetched just now. `requester` is the address the request came
    /// from (the fetch rate's key).
    pub async fn get(&self, url: &str, rules: Rules, requester: &str) -> Result<(Arc<Document>, bool), Refusal> {
        // A URL refused by its shape never takes a cache slot or a fetch.
        let parsed = check_url(url, rules.dev).map_err(Refusal::Invalid)?;
        if !self.cache.contains_key(url) {
            self.fetches
                .request(&format!("ip:{requester}"), None)
                .map_err(|l| Refusal::RateLimited(l.retry_after_secs()))?;
        }
        let entry = self
            .cache
            .entry(url.to_owned())
            .or_insert_with(fetch(parsed, rules, self.roots.clone()))
            .await;
        let fresh = entry.is_fresh();
        match entry.into_value().doc {
            Ok(d) => Ok((d, fresh)),
            Err(m) => Err(Refusal::Invalid(m)),
        }
    }
}

async fn fetch(url: Url, rules: Rules, roots: Arc<[reqwest::Certificate]>) -> Entry {
    let host = url.host_str().unwrap_or("").to_owned();
    let outcome = match tokio::time::timeout(FETCH_TIMEOUT, fetch_within(&url, rules, &roots)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "the document did not arrive within {} s",
            FETCH_TIMEOUT.as_secs()
        )),
    };
    match outcome {
        Ok((doc, ttl)) => {
            tracing::info!(host = %host, ttl_secs = ttl.as_secs(), "oauth: client metadata document fetched");
            Entry {
                doc: Ok(Arc::new(doc)),
                ttl,
            }
        }
        Err(why) => {
            tracing::warn!(host = %host, reason = %why, "oauth: client metadata document refused");
            Entry {
                doc: Err(why),
                ttl: FAILURE_TTL,
            }
        }
    }
}

/// The URL's host when it is an address (IPv6 without its brackets).
fn ip_host(u: &Url) -> Option<IpAddr> {
    u.host_str()?.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

/// The addresses `url`'s host resolves to, each one checked.
async fn checked_addresses(url: &Url, dev: bool) -> Result<Vec<SocketAddr>, String> {
    let port = url
        .port_or_known_default()
        .ok_or_else(|| "the client_id URL has no port".to_owned())?;
    let host = url.host_str().unwrap_or("");
    let addrs: Vec<SocketAddr> = match ip_host(url) {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None if host.is_empty() => return Err("the client_id URL names a host".into()),
        None => tokio::net::lookup_host((host, port))
            .await
            .map_err(|_| "the client_id URL's host does not resolve".to_owned())?
            .collect(),
    };
    if addrs.is_empty() {
        return Err("the client_id URL's host does not resolve".into());
    }
    if let Some(bad) = addrs.iter().find(|a| !allowed(classify(a.ip()), dev)) {
        let class = classify(bad.ip());
        tracing::warn!(
            host = url.host_str().unwrap_or(""),
            address = %bad.ip(),
            class = class.label(),
            "oauth: a client metadata document's host is not public"
        );
        return Err(format!(
            "the client_id URL's host resolves to a {} address; documents are fetched from public addresses only",
            class.label()
        ));
    }
    Ok(addrs)
}

async fn fetch_within(url: &Url, rules: Rules, roots: &[reqwest::Certificate]) -> Result<(Document, Duration), String> {
    let addrs = checked_addresses(url, rules.dev).await?;
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .http1_only()
        .https_only(!rules.dev)
        .timeout(FETCH_TIMEOUT)
        .connect_timeout(FETCH_TIMEOUT)
        .pool_max_idle_per_host(0)
        .user_agent(concat!(
            "mnemosyne/",
            env!("CARGO_PKG_VERSION"),
            " (OAuth client metadata)"
        ));
    for root in roots {
        b = b.add_root_certificate(root.clone());
    }
    if ip_host(url).is_none() {
        // Connect to the addresses checked, never to a second answer.
        b = b.resolve_to_addrs(url.host_str().unwrap_or(""), &addrs);
    }
    let client = b.build().map_err(|_| "no HTTP client could be made".to_owned())?;
    let mut resp = client
        .get(url.clone())
        .header(ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                format!("the document did not arrive within {} s", FETCH_TIMEOUT.as_secs())
            } else {
                "the document's server could not be reached".to_owned()
            }
        })?;
    let status = resp.status();
    if status.is_redirection() {
        return Err(format!(
            "the document's URL answered {}: redirects are not followed",
            status.as_u16()
        ));
    }
    if status != reqwest::StatusCode::OK {
        return Err(format!("the document's URL answered {}, not 200", status.as_u16()));
    }
    if !is_json(resp.headers()) {
        return Err("the document is not served as JSON (Content-Type application/json)".into());
    }
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let ttl = ttl_of(resp.headers());
    let mut body: Vec<u8> = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) if e.is_timeout() => {
                return Err(format!(
                    "the document did not arrive within {} s",
                    FETCH_TIMEOUT.as_secs()
                ))
            }
            Err(_) => return Err("the document's answer broke off".into()),
        }
    }
    let doc: Value = serde_json::from_slice(&body).map_err(|_| "the document is not JSON".to_owned())?;
    Ok((validate(&doc, url, rules)?, ttl))
}

fn too_large() -> String {
    format!("the document is larger than {} KiB", MAX_BODY / 1024)
}

/// `application/json` or any `application/…+json`.
fn is_json(h: &HeaderMap) -> bool {
    let ct = h.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// How long to keep a document: its `max-age`, clamped; the minimum for
/// `no-store` or `no-cache`; the default without either.
pub fn ttl_of(h: &HeaderMap) -> Duration {
    let mut ttl = None;
    for d in h
        .get_all(CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let d = d.trim().to_ascii_lowercase();
        if d == "no-store" || d == "no-cache" {
            return MIN_TTL;
        }
        if let Some(n) = d.strip_prefix("max-age=") {
            if let Ok(n) = n.trim_matches('"').parse::<u64>() {
                ttl = Some(Duration::from_secs(n));
            }
        }
    }
    ttl.unwrap_or(DEFAULT_TTL).clamp(MIN_TTL, MAX_TTL)
}

/// The document's checks: its `client_id` is exactly its URL; a public
/// client (no secret; `token_endpoint_auth_method` `none` or absent);
/// redirect URIs, grant and response types as registration checks them.
pub fn validate(doc: &Value, url: &Url, rules: Rules) -> Result<Document, String> {
    let obj = doc
        .as_object()
        .ok_or_else(|| "the document is not a JSON object".to_owned())?;
    match obj.get("client_id") {
        Some(Value::String(id)) if id == url.as_str() => {}
        Some(Value::String(_)) => return Err("the document's client_id is not its URL".into()),
        _ => return Err("the document has no client_id".into()),
    }
    if obj.contains_key("client_secret") || obj.contains_key("client_secret_expires_at") {
        return Err("a client metadata document cannot carry a client secret".into());
    }
    match obj.get("token_endpoint_auth_method") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == "none" => {}
        Some(_) => {
            return Err(
                "only public clients (token_endpoint_auth_method \"none\") may use a client metadata document here"
                    .into(),
            )
        }
    }
    let fields = super::client_fields(obj, rules.production).map_err(|e| e.to_string())?;
    let host = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or("")),
        None => url.host_str().unwrap_or("").to_owned(),
    };
    let mut metadata = json!({
        "client_id": url.as_str(),
        "client_name": fields.client_name,
        "redirect_uris": fields.redirect_uris,
        "grant_types": fields.grant_types,
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
        "scope": super::SCOPES.join(" "),
    });
    for (k, v) in fields.extra {
        metadata[k] = v;
    }
    Ok(Document {
        client_id: url.as_str().to_owned(),
        client_name: fields.client_name,
        redirect_uris: fields.redirect_uris,
        host,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> AddressClass {
        classify(s.parse().unwrap())
    }

    #[test]
    fn ipv4_addresses_are_classified() {
        use AddressClass::*;
        for (a, want) in [
            ("93.184.215.14", Public),
            ("8.8.8.8", Public),
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("172.32.0.1", Public),
            ("192.168.1.1", Private),
            ("100.64.0.1", Private),
            ("100.127.255.255", Private),
            ("100.128.0.1", Public),
            ("169.254.169.254", LinkLocal),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("255.255.255.255", Reserved),
            ("240.0.0.1", Reserved),
            ("192.0.2.10", Reserved),
            ("198.51.100.1", Reserved),
            ("203.0.113.7", Reserved),
            ("198.18.0.1", Reserved),
            ("192.0.0.8", Reserved),
        ] {
            assert_eq!(class(a), want, "{a}");
        }
    }

    #[test]
    fn ipv6_addresses_are_classified_and_embedded_ipv4_by_its_ipv4() {
        use AddressClass::*;
        for (a, want) in [
            ("2606:4700::6810:84e5", Public),
            ("2a00:1450:4001:80b::200e", Public),
            ("::1", Loopback),
            ("::", Unspecified),
            ("fc00::1", UniqueLocal),
            ("fd12:3456:789a::1", UniqueLocal),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("fec0::1", Private),
            ("ff02::1", Multicast),
            ("2001:db8::1", Reserved),
            ("2001:0:4136:e378::1", Reserved),
            ("::7f00:1", Reserved),
            ("100::1", Reserved),
            // IPv4-mapped: the IPv4 address decides.
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:10.0.0.1", Private),
            ("::ffff:169.254.169.254", LinkLocal),
            ("::ffff:8.8.8.8", Public),
            // NAT64 and 6to4 carry an IPv4 address too.
            ("64:ff9b::a00:1", Private),
            ("64:ff9b::808:808", Public),
            ("64:ff9b:1::1", Private),
            ("2002:7f00:1::1", Loopback),
            ("2002:c0a8:101::1", Private),
            ("2002:808:808::1", Public),
        ] {
            assert_eq!(class(a), want, "{a}");
        }
    }

    #[test]
    fn only_public_addresses_are_fetched_and_loopback_in_development() {
        for c in [
            AddressClass::Private,
            AddressClass::LinkLocal,
            AddressClass::UniqueLocal,
            AddressClass::Multicast,
            AddressClass::Unspecified,
            AddressClass::Reserved,
        ] {
            assert!(!allowed(c, false) && !allowed(c, true), "{c:?}");
        }
        assert!(allowed(AddressClass::Public, false));
        assert!(!allowed(AddressClass::Loopback, false));
        assert!(allowed(AddressClass::Loopback, true));
    }

    #[test]
    fn client_id_urls_are_https_normal_and_have_a_path() {
        assert!(check_url("https://app.example/oauth/client.json", false).is_ok());
        assert!(check_url("https://app.example:8443/c", false).is_ok());
        for bad in [
            "http://app.example/c",
            "http://127.0.0.1:8000/c",
            "https://app.example",
            "https://app.example/",
            "https://app.example/a/../c",
            "https://App.example/c",
            "https://app.example:443/c",
            "https://user:pw@app.example/c",
            "https://app.example/c#frag",
            "ftp://app.example/c",
            "mcl_abc",
        ] {
            assert!(check_url(bad, false).is_err(), "{bad}");
        }
        assert!(check_url("http://127.0.0.1:8000/c", true).is_ok(), "development");
        assert!(check_url("http://localhost:8000/c", true).is_ok(), "development");
        assert!(
            check_url("http://app.example/c", true).is_err(),
            "http only on loopback, even in development"
        );
        assert!(is_document_url("https://app.example/c"));
        assert!(is_document_url("HTTP://x"));
        assert!(!is_document_url("mcl_https://"));
    }

    #[test]
    fn the_ttl_is_max_age_clamped() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(CACHE_CONTROL, v.parse().unwrap());
            m
        };
        assert_eq!(ttl_of(&HeaderMap::new()), DEFAULT_TTL);
        assert_eq!(ttl_of(&h("public, max-age=7200")), Duration::from_secs(7200));
        assert_eq!(ttl_of(&h("max-age=5")), MIN_TTL);
        assert_eq!(ttl_of(&h("max-age=99999999")), MAX_TTL);
        assert_eq!(ttl_of(&h("no-store")), MIN_TTL);
    }

    #[test]
    fn a_document_names_itself_and_is_a_public_client() {
        let url = Url::parse("https://app.example/client.json").unwrap();
        let rules = Rules {
            dev: false,
            production: true,
        };
        let good = json!({
            "client_id": "https://app.example/client.json",
            "client_name": "App",
            "redirect_uris": ["http://127.0.0.1:3000/callback"],
            "token_endpoint_auth_method": "none",
            "logo_uri": "https://app.example/logo.png",
        });
        let d = validate(&good, &url, rules).unwrap();
        assert_eq!(d.client_name, "App");
        assert_eq!(d.host, "app.example");
        assert_eq!(d.metadata["logo_uri"], "https://app.example/logo.png");
        let mut other = good.clone();
        other["client_id"] = json!("https://evil.example/client.json");
        assert!(validate(&other, &url, rules).is_err());
        let mut secret = good.clone();
        secret["token_endpoint_auth_method"] = json!("client_secret_basic");
        assert!(validate(&secret, &url, rules).is_err());
        let mut secret = good.clone();
        secret["client_secret"] = json!("s3cret");
        assert!(validate(&secret, &url, rules).is_err());
        let mut web = good.clone();
        web["redirect_uris"] = json!(["http://app.example/cb"]);
        assert!(validate(&web, &url, rules).is_err(), "production redirect rules");
        let mut none = good;
        none.as_object_mut().unwrap().remove("redirect_uris");
        assert!(validate(&none, &url, rules).is_err());
    }
}
