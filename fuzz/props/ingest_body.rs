//! `POST /library/api/ingest/` bodies: raw bytes through the real extractor
//! (`ApiJson<IngestBody>`: JSON, then serde with `deny_unknown_fields`), then
//! the field validation ingest runs before touching a store (`Document::parse`).
//!
//! Properties:
//! - the extractor accepts exactly the JSON objects with `item` (an object with a
//!   string `title`) and a string `content`, no undeclared keys, and keeps every
//!   value as sent;
//! - a refusal is a 400 that names a field;
//! - a body that passes validation names exactly one of workspace_id / library_uid,
//!   every uid it carries (and the item uid ingest derives) is 1-64 characters of
//!   `[A-Za-z0-9_.:-]`, and every length rule holds in characters.
use std::future::Future;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use axum::extract::FromRequest;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use mnemosyne::api::library::IngestBody;
use mnemosyne::error::{ApiError, ApiJson};
use mnemosyne::ids::is_uid;
use mnemosyne::service::ingest::Document;
use mnemosyne::store::graph::ingest::derived_uid;
use serde_json::Value;

/// The extractor only reads an in-memory body: it completes on the first poll.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("extractor did not complete on an in-memory body"),
    }
}

fn chars_in(s: &str, min: usize, max: usize) -> bool {
    let n = s.chars().count();
    n >= min && n <= max && (min == 0 || !s.trim().is_empty())
}

fn uid_chars(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
}

const BODY: &[&str] = &["workspace_id", "library_uid", "collection", "item", "content"];
const ITEM: &[&str] = &["uid", "title", "source_uri", "mime_type"];

fn str_or_null(v: Option<&Value>) -> bool {
    v.is_none_or(|v| v.is_null() || v.is_string())
}

/// What the extractor should accept, decided on the parsed JSON.
fn acceptable(v: &Value) -> bool {
    let Some(o) = v.as_object() else { return false };
    let Some(item) = o.get("item").and_then(Value::as_object) else {
        return false;
    };
    o.keys().all(|k| BODY.contains(&k.as_str()))
        && item.keys().all(|k| ITEM.contains(&k.as_str()))
        && o.get("content").is_some_and(Value::is_string)
        && item.get("title").is_some_and(Value::is_string)
        && ["workspace_id", "library_uid", "collection"]
            .iter()
            .all(|k| str_or_null(o.get(*k)))
        && ["uid", "source_uri", "mime_type"]
            .iter()
            .all(|k| str_or_null(item.get(*k)))
}

fn field_str<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o.get(k).and_then(Value::as_str)
}

/// The target's body: libFuzzer's input, or one committed seed.
pub fn run(data: &[u8]) {
    let req = Request::post("/library/api/ingest/")
        .header("content-type", "application/json")
        .body(Body::from(data.to_vec()))
        .unwrap();
    let parsed = now(ApiJson::<IngestBody>::from_request(req, &()));
    let json = serde_json::from_slice::<Value>(data).ok();
    let body = match parsed {
        Ok(ApiJson(body)) => body,
        Err(e) => {
            assert!(
                json.as_ref().is_none_or(|v| !acceptable(v)),
                "refused an acceptable body: {e}"
            );
            match &e {
                ApiError::BadRequest { field: Some(f), .. } => assert!(!f.is_empty()),
                other => panic!("refusal is not a 400 naming a field: {other:?}"),
            }
            assert_eq!(e.into_response().status(), StatusCode::BAD_REQUEST);
            return;
        }
    };
    let v = json.expect("accepted a body that is not JSON");
    assert!(acceptable(&v), "accepted an unacceptable body: {v}");
    let item = &v["item"];
    assert_eq!(field_str(&v, "content"), Some(body.content.as_str()));
    assert_eq!(field_str(item, "title"), Some(body.item.title.as_str()));
    assert_eq!(field_str(&v, "workspace_id"), body.workspace_id.as_deref());
    assert_eq!(field_str(&v, "library_uid"), body.library_uid.as_deref());
    assert_eq!(field_str(&v, "collection"), body.collection.as_deref());
    assert_eq!(field_str(item, "uid"), body.item.uid.as_deref());
    assert_eq!(field_str(item, "source_uri"), body.item.source_uri.as_deref());
    assert_eq!(field_str(item, "mime_type"), body.item.mime_type.as_deref());

    for u in [&body.library_uid, &body.item.uid].into_iter().flatten() {
        assert_eq!(is_uid(u), uid_chars(u), "is_uid({u:?})");
    }
    match Document::parse(body.clone().into()) {
        Ok(_) => {
            assert!(body.workspace_id.is_some() != body.library_uid.is_some());
            if let Some(ws) = &body.workspace_id {
                assert!(chars_in(ws, 1, 64));
            }
            let lib = body.library_uid.as_deref().unwrap_or("lib_ws");
            assert!(uid_chars(lib));
            assert!(chars_in(body.collection.as_deref().unwrap_or("Files"), 1, 200));
            assert!(chars_in(&body.item.title, 1, 500));
            assert!(body.item.source_uri.as_deref().is_none_or(|s| chars_in(s, 0, 2000)));
            assert!(body.item.mime_type.as_deref().is_none_or(|s| chars_in(s, 0, 200)));
            let identity = body
                .item
                .source_uri
                .as_deref()
                .filter(|s| !s.is_empty())
                .unwrap_or(&body.item.title);
            let item_uid = body
                .item
                .uid
                .clone()
                .unwrap_or_else(|| derived_uid("item", &[lib, "col_x", identity]));
            assert!(uid_chars(&item_uid), "item uid {item_uid:?}");
        }
        Err(e) => {
            assert!(!e.field.is_empty(), "{e:?}");
            let api: ApiError = e.into();
            assert_eq!(api.into_response().status(), StatusCode::BAD_REQUEST);
        }
    }
}
