//! The API key a request presents, read the same way by the auth middleware ([`super::auth`])
//! and the admin-key check ([`super::caller`]). A leaf: it imports nothing of the server.

use axum::http::HeaderMap;

/// The API key a request presents: `X-API-Key`, else `Authorization: Bearer <key>` (the
/// scheme's name in any case, RFC 9110 §11.1). An empty `X-API-Key` presents nothing, so it
/// does not hide a bearer key.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let api_key = headers.get("x-api-key").and_then(|value| value.to_str().ok()).map(str::trim);
    if let Some(key) = api_key.filter(|key| !key.is_empty()) {
        return Some(key);
    }
    let authorization = headers.get("authorization").and_then(|value| value.to_str().ok())?.trim_start();
    let (scheme, key) = authorization.split_once([' ', '\t'])?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_read_from_x_api_key_or_a_bearer_token_of_any_case() {
        let key_of = |headers: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.append(axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
            }
            presented_key(&map).map(str::to_string)
        };
        assert_eq!(key_of(&[("x-api-key", "k1")]).as_deref(), Some("k1"));
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            assert_eq!(key_of(&[("authorization", &format!("{scheme} k1"))]).as_deref(), Some("k1"), "{scheme}");
        }
        assert_eq!(key_of(&[("authorization", "Bearer\t  k1 ")]).as_deref(), Some("k1"));
        // An empty X-API-Key does not hide the bearer key.
        assert_eq!(key_of(&[("x-api-key", ""), ("authorization", "Bearer k1")]).as_deref(), Some("k1"));
        assert_eq!(key_of(&[("x-api-key", "k2"), ("authorization", "Bearer k1")]).as_deref(), Some("k2"));
        // Other schemes, a scheme alone and a word that merely begins like one present nothing.
        for refused in ["Basic azE=", "Bearer", "Bearer ", "Bearerk1", "Token k1", ""] {
            assert_eq!(key_of(&[("authorization", refused)]), None, "{refused:?}");
        }
        assert_eq!(key_of(&[]), None);
    }
}
