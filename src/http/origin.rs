//! Host names and origins that mean this machine, shared by the request rules ([`super::guard`])
//! and by who-is-calling ([`super::caller`], the dashboard in the user's browser). Imports
//! nothing of the crate.

/// Host names that always mean this machine.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Splits `host[:port]` (IPv6 in brackets) into the lowercase host and the port text.
pub fn split_host(value: &str) -> (String, Option<&str>) {
    let value = value.trim();
    if value.starts_with('[')
        && let Some(end) = value.find(']')
    {
        let rest = &value[end + 1..];
        // After the brackets: nothing, or a port. Anything else (`[::1]evil.example`) is no
        // host of this machine: the whole text stands as the host, which matches none.
        return match rest.strip_prefix(':') {
            _ if rest.is_empty() => (value[..=end].to_ascii_lowercase(), None),
            Some(port) => (value[..=end].to_ascii_lowercase(), Some(port)),
            None => (value.to_ascii_lowercase(), None),
        };
    }
    match value.rsplit_once(':') {
        Some((host, port)) => (host.to_ascii_lowercase(), Some(port)),
        None => (value.to_ascii_lowercase(), None),
    }
}

/// Is `origin` the broker's own page (`http://localhost:<broker port>`, `http://127.0.0.1:...`,
/// `http://[::1]:...`)? Only the dashboard this broker serves has it.
pub fn is_broker_origin(origin: &str, broker_port: u16) -> bool {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let Some(authority) = origin.strip_prefix("http://") else { return false };
    let (host, port) = split_host(authority);
    broker_port != 0 && LOOPBACK_HOSTS.contains(&host.as_str()) && port == Some(broker_port.to_string().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loopback_origin_on_the_broker_port_is_the_broker_origin() {
        assert!(is_broker_origin("http://localhost:7000", 7000));
        assert!(is_broker_origin("http://127.0.0.1:7000/", 7000));
        assert!(is_broker_origin("http://[::1]:7000", 7000));
        assert!(!is_broker_origin("http://127.0.0.1:7001", 7000));
        assert!(!is_broker_origin("https://127.0.0.1:7000", 7000));
        assert!(!is_broker_origin("http://evil.example:7000", 7000));
        assert!(!is_broker_origin("http://127.0.0.1", 7000));
        assert!(!is_broker_origin("http://127.0.0.1:0", 0));
        assert!(!is_broker_origin("http://[::1]evil.example:7000", 7000));
    }

    /// Text after an IPv6 host's brackets is a port or nothing: `[::1]evil.example` is not
    /// `[::1]` (it was, with no port).
    #[test]
    fn a_bracketed_host_is_followed_by_a_port_or_nothing() {
        assert_eq!(split_host("[::1]"), ("[::1]".to_string(), None));
        assert_eq!(split_host("[::1]:8099"), ("[::1]".to_string(), Some("8099")));
        assert_eq!(split_host("[::1]evil.example").0, "[::1]evil.example");
        assert_eq!(split_host("[::1].evil.example:80").0, "[::1].evil.example:80");
        assert!(!LOOPBACK_HOSTS.contains(&split_host("[::1]evil.example").0.as_str()));
    }
}
