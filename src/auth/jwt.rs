//! JWT verification and team-token minting (DESIGN §3, spec §5).
//!
//! `jsonwebtoken` checks only the HS256 signature; the claim rules are a pure
//! function (`check_claims`) so the failure table is unit-tested row by row.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::failure::AuthFailure;

/// `exp` leeway (DESIGN §3).
pub const LEEWAY_SECS: i64 = 30;
/// Longest per-turn lifetime, `exp − iat` (DESIGN §3).
pub const PER_TURN_MAX_LIFETIME_SECS: i64 = 600;
/// Team JWTs live 10 years (spec §13.1).
pub const TEAM_LIFETIME_SECS: i64 = 10 * 365 * 24 * 3600 + 2 * 24 * 3600;

pub const ISS_DAEDALUS: &str = "daedalus";
pub const ISS_MNEMOSYNE: &str = "mnemosyne";
pub const AUDIENCE: &str = "mnemosyne";
/// Shortest HMAC key accepted for signing or verifying (RFC 7518 §3.2).
pub const MIN_SECRET_BYTES: usize = 32;

fn short_key() -> jsonwebtoken::errors::Error {
    jsonwebtoken::errors::ErrorKind::InvalidKeyFormat.into()
}

/// Classification: a compact JWS has exactly two dots; opaque tokens (ours are
/// `mnm_` + base64url) have none. A two-dot string that fails JWT checks is an
/// invalid JWT, never retried as an opaque token.
pub fn looks_like_jwt(bearer: &str) -> bool {
    bearer.bytes().filter(|b| *b == b'.').count() == 2
}

/// The header fields we act on: `alg` must be HS256, `kid` picks the key.
pub fn header_kid(token: &str) -> Result<String, AuthFailure> {
    // decode_header rejects `alg: none` and unknown algorithms itself.
    let header = jsonwebtoken::decode_header(token).map_err(|_| AuthFailure::InvalidToken)?;
    if header.alg != Algorithm::HS256 {
        return Err(AuthFailure::InvalidToken);
    }
    header.kid.filter(|k| !k.is_empty()).ok_or(AuthFailure::InvalidToken)
}

/// Verifies the HS256 signature with `secret` (the decoded bytes of the key's
/// hex) and returns the raw claims. Claims are checked by `check_claims`.
pub fn verify_signature(token: &str, secret: &[u8]) -> Result<RawClaims, AuthFailure> {
    // RFC 7518 §3.2: an HS256 key shorter than the hash is refused.
    if secret.len() < MIN_SECRET_BYTES {
        return Err(AuthFailure::InvalidToken);
    }
    let mut v = Validation::new(Algorithm::HS256);
    v.validate_exp = false;
    v.validate_aud = false;
    v.required_spec_claims.clear();
    jsonwebtoken::decode::<RawClaims>(token, &DecodingKey::from_secret(secret), &v)
        .map(|d| d.claims)
        .map_err(|_| AuthFailure::InvalidToken)
}

/// Claims as sent; every field optional so a missing one maps to the right row.
#[derive(Debug, Default, Deserialize)]
pub struct RawClaims {
    pub iss: Option<Value>,
    pub sub: Option<Value>,
    pub aud: Option<Value>,
    pub iat: Option<Value>,
    pub exp: Option<Value>,
    pub jti: Option<Value>,
    pub nbf: Option<Value>,
    pub typ: Option<Value>,
    pub libs: Option<Value>,
}

/// A validated JWT, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    PerTurn {
        sub: String,
        jti: String,
        exp: i64,
        libs: Vec<String>,
    },
    Team {
        team_id: Uuid,
        jti: Uuid,
    },
}

fn num(v: &Option<Value>) -> Option<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        _ => None,
    }
}

fn nonempty_str(v: &Option<Value>) -> Option<&str> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// The claim rules of DESIGN §3, in the order the failure table implies:
/// expiry, issuer, required claims, audience, then the kind's own rules.
pub fn check_claims(c: &RawClaims, now: i64) -> Result<Verified, AuthFailure> {
    let exp = num(&c.exp).ok_or(AuthFailure::InvalidToken)?;
    if now > exp.saturating_add(LEEWAY_SECS) {
        return Err(AuthFailure::Expired);
    }
    let iss = match nonempty_str(&c.iss) {
        Some(i @ (ISS_DAEDALUS | ISS_MNEMOSYNE)) => i,
        _ => return Err(AuthFailure::InvalidIssuer),
    };
    let sub = nonempty_str(&c.sub).ok_or(AuthFailure::InvalidToken)?;
    let iat = num(&c.iat).ok_or(AuthFailure::InvalidToken)?;
    // Issued in the future (beyond clock skew): its lifetime could not be bounded.
    if iat > now.saturating_add(LEEWAY_SECS) {
        return Err(AuthFailure::InvalidToken);
    }
    let jti = nonempty_str(&c.jti).ok_or(AuthFailure::InvalidToken)?;
    // RFC 7519 §4.1.5 / RFC 8725: not valid before `nbf` (same leeway as exp).
    match &c.nbf {
        None => {}
        Some(_) => match num(&c.nbf) {
            Some(nbf) if now.saturating_add(LEEWAY_SECS) >= nbf => {}
            _ => return Err(AuthFailure::InvalidToken),
        },
    }
    match &c.aud {
        None => {}
        Some(Value::String(a)) if a == AUDIENCE => {}
        Some(Value::Array(a)) if a.iter().any(|x| x.as_str() == Some(AUDIENCE)) => {}
        Some(_) => return Err(AuthFailure::InvalidToken),
    }
    match (iss, &c.typ) {
        (ISS_DAEDALUS, None) => {
            if exp
                .checked_sub(iat)
                .is_none_or(|life| life > PER_TURN_MAX_LIFETIME_SECS)
            {
                return Err(AuthFailure::InvalidToken);
            }
            let libs = match &c.libs {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|v| v.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(AuthFailure::InvalidToken)?,
                Some(_) => return Err(AuthFailure::InvalidToken),
            };
            Ok(Verified::PerTurn {
                sub: sub.to_owned(),
                jti: jti.to_owned(),
                exp,
                libs,
            })
        }
        (ISS_MNEMOSYNE, Some(Value::String(t))) if t == "team" => {
            let team_id = sub
                .strip_prefix("team:")
                .and_then(|u| Uuid::parse_str(u).ok())
                .ok_or(AuthFailure::InvalidToken)?;
            // A jti that is not a uuid can never equal `active_jti`.
            let jti = Uuid::parse_str(jti).map_err(|_| AuthFailure::StaleJti)?;
            Ok(Verified::Team { team_id, jti })
        }
        _ => Err(AuthFailure::InvalidToken),
    }
}

/// Claims of a team JWT (spec §5.2).
#[derive(Debug, Serialize, Deserialize)]
pub struct TeamClaims {
    pub iss: String,
    pub aud: String,
    pub sub: String,
    pub typ: String,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
}

/// Signs a team JWT with the given key (HS256, `kid` in the header).
pub fn mint_team_jwt(
    team_id: Uuid,
    jti: Uuid,
    kid: &str,
    secret: &[u8],
    now: i64,
) -> Result<String, jsonwebtoken::errors::Error> {
    let claims = TeamClaims {
        iss: ISS_MNEMOSYNE.into(),
        aud: AUDIENCE.into(),
        sub: format!("team:{team_id}"),
        typ: "team".into(),
        iat: now,
        exp: now + TEAM_LIFETIME_SECS,
        jti: jti.to_string(),
    };
    if secret.len() < MIN_SECRET_BYTES {
        return Err(short_key());
    }
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret))
}

/// Signs arbitrary claims with HS256 (per-turn minting in tests, the demo and
/// benchmarks; Daedalus does the same on its side).
pub fn sign_hs256(claims: &Value, kid: &str, secret: &[u8]) -> Result<String, jsonwebtoken::errors::Error> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(short_key());
    }
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn claims(v: Value) -> RawClaims {
        serde_json::from_value(v).unwrap()
    }

    fn per_turn() -> Value {
        json!({"iss": "daedalus", "aud": "mnemosyne", "sub": "daedalus-chat", "iat": NOW - 10,
               "exp": NOW + 590, "jti": "j1", "ws": "ws_a", "libs": ["l1", "l2"]})
    }

    fn team() -> Value {
        json!({"iss": "mnemosyne", "aud": "mnemosyne", "sub": format!("team:{}", Uuid::nil()),
               "typ": "team", "iat": NOW, "exp": NOW + TEAM_LIFETIME_SECS, "jti": Uuid::nil().to_string()})
    }

    fn with(mut v: Value, k: &str, x: Value) -> Value {
        v[k] = x;
        v
    }

    fn without(mut v: Value, k: &str) -> Value {
        v.as_object_mut().unwrap().remove(k);
        v
    }

    #[test]
    fn per_turn_and_team_issuers_are_both_accepted() {
        assert!(matches!(
            check_claims(&claims(per_turn()), NOW),
            Ok(Verified::PerTurn { .. })
        ));
        assert!(matches!(check_claims(&claims(team()), NOW), Ok(Verified::Team { .. })));
    }

    #[test]
    fn claim_failure_table() {
        let cases: Vec<(Value, AuthFailure)> = vec![
            (with(per_turn(), "exp", json!(NOW - 31)), AuthFailure::Expired),
            (with(per_turn(), "iss", json!("evil")), AuthFailure::InvalidIssuer),
            (without(per_turn(), "iss"), AuthFailure::InvalidIssuer),
            (without(per_turn(), "sub"), AuthFailure::InvalidToken),
            (without(per_turn(), "iat"), AuthFailure::InvalidToken),
            (without(per_turn(), "jti"), AuthFailure::InvalidToken),
            (without(per_turn(), "exp"), AuthFailure::InvalidToken),
            (with(per_turn(), "aud", json!("other")), AuthFailure::InvalidToken),
            (with(per_turn(), "libs", json!("l1")), AuthFailure::InvalidToken),
            (with(per_turn(), "typ", json!("team")), AuthFailure::InvalidToken),
            (with(team(), "iss", json!("daedalus")), AuthFailure::InvalidToken),
            (without(team(), "typ"), AuthFailure::InvalidToken),
            (with(team(), "sub", json!("team:not-a-uuid")), AuthFailure::InvalidToken),
            (
                with(team(), "sub", json!(Uuid::nil().to_string())),
                AuthFailure::InvalidToken,
            ),
            (with(team(), "jti", json!("not-a-uuid")), AuthFailure::StaleJti),
            // issued in the future, so exp − iat ≤ 600 would not bound its life
            (
                with(with(per_turn(), "iat", json!(NOW + 3600)), "exp", json!(NOW + 4000)),
                AuthFailure::InvalidToken,
            ),
            // not yet valid (RFC 7519 §4.1.5), beyond the leeway; a non-number nbf
            (with(per_turn(), "nbf", json!(NOW + 3600)), AuthFailure::InvalidToken),
            (with(per_turn(), "nbf", json!(NOW + 31)), AuthFailure::InvalidToken),
            (with(team(), "nbf", json!(NOW + 3600)), AuthFailure::InvalidToken),
            (with(per_turn(), "nbf", json!("soon")), AuthFailure::InvalidToken),
            // overflow-shaped values
            (with(per_turn(), "iat", json!(i64::MIN)), AuthFailure::InvalidToken),
            (with(per_turn(), "exp", json!(i64::MAX)), AuthFailure::InvalidToken),
        ];
        for (c, want) in cases {
            assert_eq!(check_claims(&claims(c.clone()), NOW), Err(want), "{c}");
        }
    }

    #[test]
    fn nbf_within_leeway_is_accepted() {
        assert!(check_claims(&claims(with(per_turn(), "nbf", json!(NOW + 30))), NOW).is_ok());
        assert!(check_claims(&claims(with(per_turn(), "nbf", json!(NOW - 10))), NOW).is_ok());
    }

    #[test]
    fn keys_shorter_than_32_bytes_neither_sign_nor_verify() {
        let short = [7u8; 31];
        assert!(sign_hs256(&per_turn(), "k", &short).is_err());
        assert!(mint_team_jwt(Uuid::nil(), Uuid::nil(), "k", &short, NOW).is_err());
        let long = [7u8; 32];
        let token = sign_hs256(&per_turn(), "k", &long).unwrap();
        assert!(verify_signature(&token, &long).is_ok());
        // The same token checked with a short key (e.g. a truncated secret row).
        assert_eq!(verify_signature(&token, &short).err(), Some(AuthFailure::InvalidToken));
    }

    #[test]
    fn exp_leeway_is_thirty_seconds() {
        assert!(check_claims(&claims(with(per_turn(), "exp", json!(NOW - 30))), NOW).is_ok());
        assert_eq!(
            check_claims(&claims(with(per_turn(), "exp", json!(NOW - 31))), NOW),
            Err(AuthFailure::Expired)
        );
    }

    #[test]
    fn per_turn_lifetime_is_at_most_600_seconds() {
        let ok = with(with(per_turn(), "iat", json!(NOW - 10)), "exp", json!(NOW + 590));
        assert!(check_claims(&claims(ok), NOW).is_ok());
        let long = with(with(per_turn(), "iat", json!(NOW - 10)), "exp", json!(NOW + 591));
        assert_eq!(check_claims(&claims(long), NOW), Err(AuthFailure::InvalidToken));
    }

    #[test]
    fn per_turn_without_libs_resolves_to_empty() {
        match check_claims(&claims(without(per_turn(), "libs")), NOW) {
            Ok(Verified::PerTurn { libs, .. }) => assert!(libs.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn aud_is_optional() {
        assert!(check_claims(&claims(without(per_turn(), "aud")), NOW).is_ok());
    }

    #[test]
    fn header_rules() {
        let secret = [7u8; 32];
        let good = sign_hs256(&per_turn(), "k1", &secret).unwrap();
        assert_eq!(header_kid(&good).unwrap(), "k1");
        assert!(verify_signature(&good, &secret).is_ok());
        assert_eq!(
            verify_signature(&good, &[8u8; 32]).unwrap_err(),
            AuthFailure::InvalidToken
        );
        // HS512 header
        let mut h = Header::new(Algorithm::HS512);
        h.kid = Some("k1".into());
        let hs512 = jsonwebtoken::encode(&h, &per_turn(), &EncodingKey::from_secret(&secret)).unwrap();
        assert_eq!(header_kid(&hs512), Err(AuthFailure::InvalidToken));
        // alg none, hand-built
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let none = format!(
            "{}.{}.",
            b64.encode(br#"{"alg":"none","kid":"k1","typ":"JWT"}"#),
            b64.encode(per_turn().to_string())
        );
        assert_eq!(header_kid(&none), Err(AuthFailure::InvalidToken));
        // RS256 header with an HMAC signature
        let rs = format!(
            "{}.{}.{}",
            b64.encode(br#"{"alg":"RS256","kid":"k1"}"#),
            b64.encode(per_turn().to_string()),
            b64.encode([0u8; 32])
        );
        assert_eq!(header_kid(&rs), Err(AuthFailure::InvalidToken));
        // no kid
        let nokid = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &per_turn(),
            &EncodingKey::from_secret(&secret),
        )
        .unwrap();
        assert_eq!(header_kid(&nokid), Err(AuthFailure::InvalidToken));
    }

    #[test]
    fn minted_team_jwt_has_spec_claims() {
        let secret = [1u8; 32];
        let id = Uuid::new_v4();
        let jti = Uuid::new_v4();
        let t = mint_team_jwt(id, jti, "kid1", &secret, NOW).unwrap();
        assert_eq!(header_kid(&t).unwrap(), "kid1");
        let c = verify_signature(&t, &secret).unwrap();
        assert_eq!(check_claims(&c, NOW), Ok(Verified::Team { team_id: id, jti }));
        assert_eq!(num(&c.exp).unwrap() - num(&c.iat).unwrap(), TEAM_LIFETIME_SECS);
        assert_eq!(c.aud, Some(json!("mnemosyne")));
    }
}
