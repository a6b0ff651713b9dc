//! JWT claims from arbitrary JSON: `check_claims` on `RawClaims`, directly and
//! through a real token (`sign_hs256` → `verify_signature`).
//!
//! Properties:
//! - only a JSON object is accepted as a claims set (RFC 7519 §7.2);
//! - signing then verifying gives back claims with the same verdict (or
//!   jsonwebtoken refuses them first);
//! - a per-turn token is never accepted when exp − iat > 600 s (exactly, for
//!   integer NumericDates; NumericDates are read as whole seconds, so fractional
//!   ones may exceed by less than the truncated fractions), nor when expired
//!   beyond the 30 s leeway, nor 661 s later;
//! - an accepted per-turn token has iss `daedalus`, no `typ`, the sub / jti / libs
//!   it was given, and an audience that is absent or names `mnemosyne`;
//! - an accepted team token has iss `mnemosyne`, typ `team`, `sub` = `team:<its uuid>`.
use mnemosyne::auth::jwt::{
    check_claims, header_kid, looks_like_jwt, sign_hs256, verify_signature, RawClaims, Verified, LEEWAY_SECS,
    PER_TURN_MAX_LIFETIME_SECS,
};
use serde_json::Value;

const KEY: &[u8] = b"mnemosyne-fuzz-key-0123456789abc";
const OTHER_KEY: &[u8] = b"mnemosyne-fuzz-key-0123456789abd";
/// The seed claims are valid at this instant.
const NOW: i64 = 1_764_000_000;

fn aud_ok(aud: Option<&Value>) -> bool {
    match aud {
        None | Some(Value::Null) => true,
        Some(Value::String(a)) => a == "mnemosyne",
        Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some("mnemosyne")),
        Some(_) => false,
    }
}

fn check_per_turn(v: &Value, sub: &str, jti: &str, exp: i64, libs: &[String]) {
    assert_eq!(v["iss"], "daedalus");
    assert!(v.get("typ").is_none_or(Value::is_null), "per-turn with a typ");
    assert_eq!(v["sub"].as_str(), Some(sub));
    assert!(!sub.is_empty() && !jti.is_empty());
    assert_eq!(v["jti"].as_str(), Some(jti));
    assert!(aud_ok(v.get("aud")));
    assert!(NOW <= exp + LEEWAY_SECS, "accepted after expiry");
    match v.get("libs") {
        None | Some(Value::Null) => assert!(libs.is_empty()),
        Some(Value::Array(a)) => {
            let given: Vec<&str> = a.iter().map(|x| x.as_str().unwrap()).collect();
            assert_eq!(given, libs);
        }
        Some(other) => panic!("libs accepted as {other}"),
    }
    let (e, i) = (&v["exp"], &v["iat"]);
    assert!(e.is_number() && i.is_number());
    match (e.as_i64(), i.as_i64()) {
        (Some(e), Some(i)) => assert!(
            i128::from(e) - i128::from(i) <= i128::from(PER_TURN_MAX_LIFETIME_SECS),
            "per-turn lifetime {e} - {i} > 600"
        ),
        _ => {
            let life = e.as_f64().unwrap() - i.as_f64().unwrap();
            assert!(
                life < (PER_TURN_MAX_LIFETIME_SECS + 2) as f64,
                "per-turn lifetime {life}"
            );
        }
    }
}

fn check_team(v: &Value, team_id: uuid::Uuid) {
    assert_eq!(v["iss"], "mnemosyne");
    assert_eq!(v["typ"], "team");
    assert!(aud_ok(v.get("aud")));
    let sub = v["sub"].as_str().unwrap();
    let id = sub.strip_prefix("team:").expect("team sub without team:");
    assert_eq!(uuid::Uuid::parse_str(id).unwrap(), team_id);
}

/// The target's body: libFuzzer's input, or one committed seed.
pub fn run(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Ok(raw) = serde_json::from_value::<RawClaims>(value.clone()) else {
        return;
    };
    let verdict = check_claims(&raw, NOW);
    // RFC 7519 §7.2: the claims set is a JSON object. (serde would read a
    // 9-element array as `RawClaims`, but jsonwebtoken's own 5-field claims
    // check refuses it first: no token carrying a non-object is accepted.)
    if !value.is_object() {
        let token = sign_hs256(&value, "fuzz", KEY).expect("sign");
        if let Ok(back) = verify_signature(&token, KEY) {
            assert!(check_claims(&back, NOW).is_err(), "token accepted with claims {value}");
        }
        return;
    }
    match &verdict {
        Ok(Verified::PerTurn { sub, jti, exp, libs }) => {
            check_per_turn(&value, sub, jti, *exp, libs);
            assert!(
                check_claims(&raw, NOW + 661).is_err(),
                "per-turn token alive 661 s later"
            );
        }
        Ok(Verified::Team { team_id, .. }) => check_team(&value, *team_id),
        Err(_) => {}
    }
    if value.get("exp").is_none_or(|e| !e.is_number()) {
        assert!(verdict.is_err(), "accepted without a numeric exp");
    }

    // The same claims through a real token.
    let token = sign_hs256(&value, "fuzz", KEY).expect("sign");
    assert!(looks_like_jwt(&token));
    assert_eq!(header_kid(&token).as_deref(), Ok("fuzz"));
    assert!(verify_signature(&token, OTHER_KEY).is_err());
    // jsonwebtoken's own claims parse refuses some malformed claims before
    // ours (a non-string sub / iss / aud, a negative exp / nbf): stricter, safe.
    if let Ok(back) = verify_signature(&token, KEY) {
        assert_eq!(check_claims(&back, NOW), verdict);
    }
}
