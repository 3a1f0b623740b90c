//! Agent secrets and digests: how a secret is stored (its SHA-256, in hex) and the one way two
//! secret-derived values are compared.
//!
//! Invariants: a secret itself is never stored, only [`hash_secret`] of it; every comparison of
//! a presented secret or key with a stored one goes through [`constant_time_eq`], whose time does
//! not depend on where the values differ (only on their length, which is public: digests all have
//! the same). Imports nothing of the crate.

use sha2::Digest;
use subtle::ConstantTimeEq;

/// The stored form of an agent's secret: SHA-256, lowercase hex.
pub fn hash_secret(secret: &str) -> String {
    to_hex(&sha2::Sha256::digest(secret.as_bytes()))
}

/// A new random token, 64 hex digits of which 244 bits are random (two UUID v4s): what a
/// client presents once as proof (a reply token, a stream token).
pub fn random_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Lowercase hexadecimal (digests, signatures).
pub fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    hex
}

/// Are `left` and `right` equal? Constant time in their content (values of different lengths
/// are unequal at once).
pub fn constant_time_eq(left: &[u8], right: &[u8]) -> bool {
    bool::from(left.ct_eq(right))
}

/// Does `secret` hash to `stored_hash` (a [`hash_secret`] digest)? Constant time.
pub fn secret_matches(secret: &str, stored_hash: &str) -> bool {
    constant_time_eq(hash_secret(secret).as_bytes(), stored_hash.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_matches_its_own_hash_only() {
        let stored = hash_secret("s3cret");
        assert_eq!(stored.len(), 64);
        assert!(secret_matches("s3cret", &stored));
        assert!(!secret_matches("s3cret ", &stored));
        assert!(!secret_matches("s3cret", &stored[..63]));
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"a", b"b"));
    }

    #[test]
    fn hex_is_lowercase_two_digits_per_byte() {
        assert_eq!(to_hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
