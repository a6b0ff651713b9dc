//! Raw bearer strings as they arrive in `Authorization: Bearer …`:
//! classification (`looks_like_jwt`), header parsing (`header_kid`) and the
//! HS256 signature check (`verify_signature`), then the claim rules.
//!
//! Properties:
//! - a bearer is classified as a JWT exactly when it has two dots;
//! - anything the JWT parser accepts (header or signature) was classified as a
//!   JWT, so no accepted JWT is ever retried as an opaque token and no opaque
//!   token reaches the JWT parser successfully;
//! - an accepted `kid` is non-empty;
//! - a key shorter than 32 bytes never verifies anything;
//! - a token that verifies under the fuzz key does not verify under another key.
use mnemosyne::auth::jwt::{check_claims, header_kid, looks_like_jwt, verify_signature};

/// The key the seed tokens in `fuzz/corpus/jwt_bearer` are signed with.
const KEY: &[u8] = b"mnemosyne-fuzz-key-0123456789abc";
const OTHER_KEY: &[u8] = b"mnemosyne-fuzz-key-0123456789abd";
/// The seeds' claims are valid at this instant.
const NOW: i64 = 1_764_000_000;

/// The target's body: libFuzzer's input, or one committed seed.
pub fn run(data: &[u8]) {
    // Header values reach us as bytes; non-UTF-8 never gets past the extractor.
    let Ok(bearer) = std::str::from_utf8(data) else { return };
    let jwt = looks_like_jwt(bearer);
    assert_eq!(jwt, bearer.bytes().filter(|b| *b == b'.').count() == 2);

    if let Ok(kid) = header_kid(bearer) {
        assert!(jwt, "header parsed from a non-JWT bearer: {bearer:?}");
        assert!(!kid.is_empty());
    }
    assert!(verify_signature(bearer, &KEY[..31]).is_err(), "31-byte key verified");
    if let Ok(claims) = verify_signature(bearer, KEY) {
        assert!(jwt, "signature verified on a non-JWT bearer: {bearer:?}");
        assert!(verify_signature(bearer, OTHER_KEY).is_err(), "verified under two keys");
        let _ = check_claims(&claims, NOW);
    }
}
