//! Requests the broker makes to other HTTP servers (webhook receivers, external agents):
//! plain HTTP/1.1 over TCP, no TLS.
//!
//! What must stay true, whatever a registered URL or its server does:
//! - the target is checked on the **resolved** address, and the connection goes to exactly the
//!   address that was checked (no second lookup a DNS answer could change);
//! - loopback, private, link-local and unspecified addresses are refused unless the home's
//!   `outbound_allow_private` setting (`SYNAPSE_OUTBOUND_ALLOW_PRIVATE`) allows them, and this
//!   broker itself (its port or an agent's port on a local address) is never a target;
//! - connecting takes at most [`CONNECT_TIMEOUT`], the answer at most the caller's limit
//!   (default [`READ_TIMEOUT`]), and at most [`BODY_LIMIT_BYTES`] of a body are read.

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// How long establishing a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the answer may take once connected (unless a caller gives its own limit).
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a response body that is read; the rest is never received.
pub const BODY_LIMIT_BYTES: usize = 64 * 1024;

/// Which targets an outgoing request may reach (from the broker's state, at the call).
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Loopback and private addresses are allowed (tests, single-machine setups).
    pub allow_private: bool,
    /// The ports this broker serves (its own and its agents'): never a target on a local
    /// address, so a URL cannot make the broker call its own control routes.
    pub own_ports: Vec<u16>,
}

/// Addresses of this machine or its private networks, and the ranges no public service uses
/// (reserved, benchmarking, documentation, protocol assignments). An IPv6 address that carries
/// an IPv4 one (mapped, compatible, NAT64's well-known prefix, 6to4) is judged by that address;
/// Teredo, local-use NAT64 and site-local prefixes are private as a whole.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && (c == 0 || c == 2))
                || (a == 198 && (b == 18 || b == 19))
                || (a == 198 && b == 51 && c == 100)
                || (a == 203 && b == 0 && c == 113)
                || a >= 240
        }
        IpAddr::V6(v6) => match embedded_ipv4(v6) {
            Some(v4) => is_private(IpAddr::V4(v4)),
            None => {
                let segments = v6.segments();
                let first = segments[0];
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || (first & 0xfe00) == 0xfc00
                    || (first & 0xffc0) == 0xfe80
                    || (first & 0xffc0) == 0xfec0
                    // Teredo (its client's IPv4 address is hidden in it), documentation.
                    || (first == 0x2001 && (segments[1] == 0 || segments[1] == 0x0db8))
                    // Local-use NAT64 (RFC 8215), the discard prefix (RFC 6666).
                    || (first == 0x64 && segments[1] == 0xff9b && segments[2] == 1)
                    || (first == 0x100 && segments[1..4] == [0, 0, 0])
            }
        },
    }
}

/// The IPv4 address an IPv6 one carries: mapped (`::ffff:a.b.c.d`), compatible (`::a.b.c.d`,
/// deprecated), NAT64's well-known prefix (`64:ff9b::a.b.c.d`, which a NAT64 gateway turns into
/// that address) or 6to4 (`2002:aabb:ccdd::`).
fn embedded_ipv4(v6: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let segments = v6.segments();
    let from = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        std::net::Ipv4Addr::new(a, b, c, d)
    };
    match segments {
        // `::` and `::1` are IPv6's own, not IPv4-compatible addresses.
        [0, 0, 0, 0, 0, 0, high, low] if high != 0 || low > 1 => Some(from(high, low)),
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] => Some(from(high, low)),
        [0x2002, high, low, ..] => Some(from(high, low)),
        _ => None,
    }
}

/// An address that reaches this machine itself.
fn is_local(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        other => other,
    };
    ip.is_loopback() || ip.is_unspecified()
}

impl Policy {
    /// Refuses an address this policy does not allow, saying why.
    pub fn check(&self, address: SocketAddr) -> Result<(), String> {
        let ip = address.ip();
        if is_local(ip) && self.own_ports.contains(&address.port()) {
            return Err(format!("{address} is this Synapse broker itself; it is never a target"));
        }
        if is_private(ip) && !self.allow_private {
            return Err(format!(
                "{address} is a loopback or private address; set SYNAPSE_OUTBOUND_ALLOW_PRIVATE=true on 'synapse broker start' to allow such targets"
            ));
        }
        Ok(())
    }

    /// Resolves `host:port` and returns the first allowed address (every refused one is named
    /// when none is allowed).
    pub async fn resolve(&self, host: &str, port: u16) -> Result<SocketAddr, String> {
        let addresses: Vec<SocketAddr> =
            match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port))).await {
                Ok(Ok(addresses)) => addresses.collect(),
                Ok(Err(error)) => return Err(format!("cannot resolve {host}: {error}")),
                Err(_) => return Err(format!("resolving {host} took more than {} s", CONNECT_TIMEOUT.as_secs())),
            };
        let mut refusals = Vec::new();
        for address in addresses {
            match self.check(address) {
                Ok(()) => return Ok(address),
                Err(refusal) => refusals.push(refusal),
            }
        }
        Err(if refusals.is_empty() { format!("{host} has no address") } else { refusals.join("; ") })
    }

    /// Checks a URL before it is registered: parses it and resolves its host.
    pub async fn check_url(&self, url: &str) -> Result<(), String> {
        let (host, port, _) = parse_url(url)?;
        self.resolve(&host, port).await.map(|_| ())
    }
}

/// `http://host[:port][/path][?query]`: (host, port, path and query). Parsed as HTTP clients
/// and browsers parse URLs (WHATWG, the `url` crate), so the host checked is the host a client
/// would reach: `http://127.1`, `http://0x7f.1` and `http://[::ffff:7f00:1]` are all 127.0.0.1.
/// User information (`user@host`) is refused: it only serves to hide the real host.
pub fn parse_url(url: &str) -> Result<(String, u16, String), String> {
    let parsed = url::Url::parse(url).map_err(|error| match error {
        url::ParseError::RelativeUrlWithoutBase => format!("'{url}' is not an http:// URL"),
        url::ParseError::InvalidPort => format!("'{url}': bad port"),
        _ => format!("'{url}': bad host ({error})"),
    })?;
    match parsed.scheme() {
        "http" => {}
        "https" => return Err(format!("'{url}': only http:// URLs are supported (this build has no TLS)")),
        _ => return Err(format!("'{url}' is not an http:// URL")),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(format!("'{url}': bad host (no user information is accepted)"));
    }
    let host = match parsed.host() {
        Some(url::Host::Domain(domain)) if !domain.is_empty() => domain.to_string(),
        Some(url::Host::Ipv4(address)) => address.to_string(),
        Some(url::Host::Ipv6(address)) => address.to_string(),
        _ => return Err(format!("'{url}': bad host")),
    };
    let port = parsed.port_or_known_default().unwrap_or(80);
    if port == 0 {
        return Err(format!("'{url}': bad port '0'"));
    }
    let path = &parsed[url::Position::BeforePath..url::Position::AfterQuery];
    Ok((host, port, if path.is_empty() { "/".to_string() } else { path.to_string() }))
}

/// `url` in the one spelling every spelling of it has (host in lowercase, the default port
/// left out, an empty path as `/`, no fragment), so one target is one registration.
pub fn normalise_url(url: &str) -> Result<String, String> {
    parse_url(url)?;
    let mut parsed = url::Url::parse(url).map_err(|error| format!("'{url}': {error}"))?;
    parsed.set_fragment(None);
    Ok(parsed.to_string())
}

/// An answer: status and body (at most [`BODY_LIMIT_BYTES`] of it).
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
    /// Only the body's start was read: it was longer than the limit (the rest was dropped), or
    /// its end was lost after the status came (then the body is empty).
    pub truncated: bool,
}

/// An open response whose body is read piece by piece (server-sent events).
pub type Streaming = hyper::Response<hyper::body::Incoming>;

/// Why a request has no usable answer, and whether the server may have taken it: once the
/// request is on its way, a timeout or a lost connection leaves that unknown.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub may_have_arrived: bool,
}

/// Opens the request; `sent` is set once it is handed to the connection.
async fn open(
    policy: &Policy,
    method: hyper::Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<Vec<u8>>,
    sent: &std::sync::atomic::AtomicBool,
) -> Result<Streaming, String> {
    let (host, port, path) = parse_url(url)?;
    // The address checked is the address connected to.
    let address = policy.resolve(&host, port).await?;
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Err(format!("cannot reach {host}:{port}: {error}")),
        Err(_) => return Err(format!("cannot reach {host}:{port} within {} s", CONNECT_TIMEOUT.as_secs())),
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|error| format!("{url}: {error}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request =
        hyper::Request::builder().method(method).uri(path.as_str()).header("host", host_header(&host, port));
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let request =
        request.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|error| format!("{url}: {error}"))?;
    sender.ready().await.map_err(|error| format!("{url}: {error}"))?;
    // From here the request may be written at any moment: a timeout leaves it unknown. A
    // failure that gives the request back says it was never written.
    sent.store(true, std::sync::atomic::Ordering::Relaxed);
    sender.try_send_request(request).await.map_err(|error| {
        if error.message().is_some() {
            sent.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        format!("{url}: {}", error.error())
    })
}

/// The `Host` header for a host as [`parse_url`] gives it: an IPv6 address in brackets (RFC
/// 7230 §5.4; without them `2001:db8::5:9000` does not say where the port starts).
fn host_header(host: &str, port: u16) -> String {
    if host.parse::<std::net::Ipv6Addr>().is_ok() { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// Reads at most [`BODY_LIMIT_BYTES`] of a body; dropping the rest closes the connection.
async fn read_capped(url: &str, mut body: hyper::body::Incoming) -> Result<(Bytes, bool), String> {
    let mut collected: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| format!("{url}: {error}"))?;
        let Some(data) = frame.data_ref() else { continue };
        let room = BODY_LIMIT_BYTES - collected.len();
        if data.len() > room {
            collected.extend_from_slice(&data[..room]);
            return Ok((Bytes::from(collected), true));
        }
        collected.extend_from_slice(data);
    }
    Ok((Bytes::from(collected), false))
}

/// One request with its answer (the body capped at [`BODY_LIMIT_BYTES`]), connected within
/// [`CONNECT_TIMEOUT`] and answered within `limit`.
pub async fn request(
    policy: &Policy,
    method: hyper::Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<Vec<u8>>,
    limit: Duration,
) -> Result<Answer, String> {
    exchange(policy, method, url, headers, body, limit).await.map_err(|failure| failure.message)
}

/// [`request`], saying of a failure whether the server may have taken the request (a message
/// that may have arrived is not one to report undelivered, or to send again).
pub async fn exchange(
    policy: &Policy,
    method: hyper::Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<Vec<u8>>,
    limit: Duration,
) -> Result<Answer, Failure> {
    use std::sync::atomic::Ordering::Relaxed;
    let sent = std::sync::atomic::AtomicBool::new(false);
    // The answer's status once it came (0 before).
    let answered = std::sync::atomic::AtomicU16::new(0);
    let exchange = async {
        let response = open(policy, method, url, headers, body, &sent).await?;
        let status = response.status().as_u16();
        answered.store(status, Relaxed);
        let (body, truncated) = read_capped(url, response.into_body()).await?;
        Ok(Answer { status, body, truncated })
    };
    let result = match tokio::time::timeout(limit, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("{url} did not answer within {:.1} s", limit.as_secs_f64())),
    };
    result.or_else(|message| {
        let status = answered.load(Relaxed);
        if status != 0 {
            // The status came: the server said what it did with the request (a 2xx took it);
            // only the body's end was lost, as when it is cut at the limit.
            tracing::debug!("{url} answered {status}, then: {message}");
            return Ok(Answer { status, body: Bytes::new(), truncated: true });
        }
        Err(Failure { message, may_have_arrived: sent.load(Relaxed) })
    })
}

/// Opens a streaming request (the headers must arrive within `limit`).
pub async fn stream(policy: &Policy, url: &str, limit: Duration) -> Result<Streaming, String> {
    match tokio::time::timeout(
        limit,
        open(
            policy,
            hyper::Method::GET,
            url,
            &[("accept", "text/event-stream".into())],
            None,
            &std::sync::atomic::AtomicBool::new(false),
        ),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(format!("{url} did not answer within {:.1} s", limit.as_secs_f64())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_brackets_an_ipv6_address() {
        let header = |url: &str| {
            let (host, port, _) = parse_url(url).unwrap();
            host_header(&host, port)
        };
        assert_eq!(header("http://[2001:db8::5]:9000/hook"), "[2001:db8::5]:9000");
        assert_eq!(header("http://[::1]/"), "[::1]:80");
        assert_eq!(header("http://127.0.0.1:8080/x"), "127.0.0.1:8080");
        assert_eq!(header("http://example.test/x"), "example.test:80");
    }

    #[test]
    fn urls_are_read_as_http_clients_read_them() {
        let parsed = |url: &str| parse_url(url).map(|(host, port, _)| (host, port));
        assert_eq!(
            parse_url("http://127.0.0.1:9000/hook?x=1#frag").unwrap(),
            ("127.0.0.1".into(), 9000, "/hook?x=1".into())
        );
        assert_eq!(parsed("http://127.1/").unwrap(), ("127.0.0.1".into(), 80));
        assert_eq!(parsed("http://0x7f.0.0.1:81").unwrap(), ("127.0.0.1".into(), 81));
        assert_eq!(parsed("http://[::ffff:127.0.0.1]:82").unwrap(), ("::ffff:127.0.0.1".into(), 82));
        assert_eq!(parsed("HTTP://Example.TEST").unwrap(), ("example.test".into(), 80));
        assert!(parse_url("http://user@127.0.0.1/").is_err(), "user information hides the host");
        // A backslash ends the host, as in browsers: the host checked is the one reached.
        assert_eq!(parsed("http://evil.test\\@127.0.0.1/").unwrap().0, "evil.test");
        assert!(parse_url("http://127.0.0.1:0/").is_err());
        assert!(parse_url("http://host:70000/").is_err());
        assert!(parse_url("/relative").is_err());
        assert!(parse_url("http://b\u{fc}cher.example/").is_err(), "non-ASCII hosts are refused (see Cargo.toml)");
        assert!(parse_url("http://xn--bcher-kva.example/").is_ok());
    }

    #[test]
    fn one_target_has_one_spelling() {
        for spelling in ["http://h.test/x", "HTTP://H.TEST:80/x", "http://h.test/x#part", " http://h.test:80/x"] {
            assert_eq!(normalise_url(spelling.trim()).as_deref(), Ok("http://h.test/x"), "{spelling}");
        }
        assert_eq!(normalise_url("http://h.test").as_deref(), Ok("http://h.test/"));
        assert_eq!(normalise_url("http://127.1:8080/a?b=1").as_deref(), Ok("http://127.0.0.1:8080/a?b=1"));
        assert_ne!(normalise_url("http://h.test/X"), normalise_url("http://h.test/x"), "paths keep their case");
        assert!(normalise_url("https://h.test/").is_err());
    }

    #[test]
    fn private_and_local_addresses_are_recognised_in_every_spelling() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "::",
            "fc00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            // Reserved, benchmarking, documentation and protocol-assignment ranges.
            "240.0.0.1",
            "198.18.0.1",
            "192.0.0.170",
            "192.0.2.1",
            // IPv6 forms that reach an IPv4 address: NAT64, 6to4, compatible.
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
            "::10.0.0.1",
            "::127.0.0.1",
            // Teredo, local-use NAT64, site-local, documentation, discard.
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "64:ff9b:1::a00:1",
            "fec0::1",
            "2001:db8::5",
            "100::1",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2001:4860:4860::8888",
        ] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn the_broker_itself_is_refused_even_when_private_targets_are_allowed() {
        let policy = Policy { allow_private: true, own_ports: vec![8099, 8100] };
        assert!(policy.check("127.0.0.1:8099".parse().unwrap()).is_err());
        assert!(policy.check("[::ffff:127.0.0.1]:8100".parse().unwrap()).is_err());
        assert!(policy.check("0.0.0.0:8099".parse().unwrap()).is_err());
        assert!(policy.check("127.0.0.1:9000".parse().unwrap()).is_ok());
        let strict = Policy { allow_private: false, own_ports: vec![] };
        assert!(strict.check("127.0.0.1:9000".parse().unwrap()).is_err());
        assert!(strict.check("8.8.8.8:80".parse().unwrap()).is_ok());
    }
}
