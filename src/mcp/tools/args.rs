//! Tool arguments (SEP-1303): rmcp does not validate arguments against the
//! input schema, so each tool parses its own. A tool's arguments are one
//! struct: its derived schema is what `tools/list` publishes, its
//! deserialisation refuses unknown, missing and mistyped arguments, and its
//! `check` refuses what types cannot say (blank strings, numbers out of
//! range) — from the same constants the schema attributes read. A bad one
//! comes back as an `isError` result naming the argument.

use rmcp::model::JsonObject;
use schemars::{JsonSchema, Schema};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A bad argument: its name and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    pub name: String,
    pub message: String,
}

impl ArgError {
    pub fn new(name: &str, message: impl Into<String>) -> Self {
        ArgError {
            name: name.to_owned(),
            message: message.into(),
        }
    }

    /// Names the argument a deserialisation error is about: the first
    /// segment of its path, or, for a missing field (reported on the
    /// object), the field serde names.
    fn from_serde(e: serde_path_to_error::Error<serde_json::Error>) -> Self {
        use serde_path_to_error::Segment;
        let message = e.inner().to_string();
        let mut segments = e.path().iter();
        match segments.next() {
            Some(Segment::Map { key }) => {
                let message = if message.starts_with("unknown field `") {
                    "unknown argument".to_owned()
                } else if message.starts_with("invalid type: null") && segments.len() == 0 {
                    // Only required arguments refuse null (null is absent).
                    "is required".to_owned()
                } else {
                    let inner = segments.map(|s| s.to_string()).collect::<Vec<_>>().join(".");
                    if inner.is_empty() {
                        message
                    } else {
                        format!("{inner}: {message}")
                    }
                };
                ArgError::new(key, message)
            }
            _ => match backquoted(&message, "missing field `") {
                Some(field) => ArgError::new(field, "is required"),
                None => ArgError::new("arguments", message),
            },
        }
    }
}

/// The name in serde's "missing field `x`" message.
fn backquoted<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    message.strip_prefix(prefix)?.split('`').next()
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Invalid argument `{}`: {}", self.name, self.message)
    }
}

impl std::error::Error for ArgError {}

/// One tool's arguments.
pub trait ToolArgs: DeserializeOwned + JsonSchema + 'static {
    /// What checking yields beyond the arguments themselves: the integers
    /// with their defaults applied, so a tool reads each one once.
    type Checked;

    /// Refuses what the types cannot: blank strings, numbers out of range.
    fn check(&self) -> Result<Self::Checked, ArgError>;
}

/// Parses and checks a tool's arguments; the error names the argument.
pub fn parse<T: ToolArgs>(args: JsonObject) -> Result<(T, T::Checked), ArgError> {
    let parsed: T = serde_path_to_error::deserialize(Value::Object(args)).map_err(ArgError::from_serde)?;
    let checked = parsed.check()?;
    Ok((parsed, checked))
}

/// Bounds of a string argument, in characters; a required one (`min > 0`)
/// must not be blank.
#[derive(Clone, Copy, Debug)]
pub struct Len {
    pub min: usize,
    pub max: usize,
}

/// Bounds of an integer argument and its value when absent.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    pub min: i64,
    pub max: i64,
    pub default: i64,
}

/// A uid argument (library, collection, chunk).
pub const UID: Len = Len { min: 1, max: 64 };
/// `limit` of the list tools.
pub const PAGE: Range = Range {
    min: 1,
    max: 200,
    default: 50,
};
/// `cursor` of the list tools: checked, not published (the schema says only
/// "string", as it always has).
pub const CURSOR: Len = Len { min: 1, max: 1000 };

/// Checks a string argument against its bounds.
pub fn text(name: &str, value: &str, len: Len) -> Result<(), ArgError> {
    let n = value.chars().count();
    if n < len.min || len.min > 0 && value.trim().is_empty() {
        Err(ArgError::new(
            name,
            format!("must be at least {} non-blank character(s)", len.min),
        ))
    } else if n > len.max {
        Err(ArgError::new(name, format!("must be at most {} characters", len.max)))
    } else {
        Ok(())
    }
}

/// Checks a uid argument: the one rule of `ids` (1-64 characters of letters,
/// digits, `_ - . :`), which every stored uid follows — so a refused value
/// could not have named anything.
pub fn uid(name: &str, value: &str) -> Result<(), ArgError> {
    crate::ids::Uid::parse(name, value)
        .map(|_| ())
        .map_err(|_| ArgError::new(name, format!("must be {}", crate::ids::Uid::RULE)))
}

/// Checks an optional uid argument (absent is fine).
pub fn opt_uid(name: &str, value: &Option<String>) -> Result<(), ArgError> {
    value.as_deref().map_or(Ok(()), |v| uid(name, v))
}

/// Checks an optional string argument (absent is fine).
pub fn opt_text(name: &str, value: &Option<String>, len: Len) -> Result<(), ArgError> {
    value.as_deref().map_or(Ok(()), |v| text(name, v, len))
}

/// An integer argument's value: the default when absent, else in range.
pub fn int(name: &str, value: Option<i64>, range: Range) -> Result<i64, ArgError> {
    match value {
        None => Ok(range.default),
        Some(v) if (range.min..=range.max).contains(&v) => Ok(v),
        Some(_) => Err(ArgError::new(
            name,
            format!("must be an integer from {} to {}", range.min, range.max),
        )),
    }
}

/// Schema transform of every argument struct: absent and `null` mean the
/// same to the tools (clients send either), but the published schema names
/// only the type, as it always has — so `"null"` is dropped from each
/// optional property's `type`.
pub fn null_is_absent(schema: &mut Schema) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for prop in props.values_mut() {
        if let Some(Value::Array(types)) = prop.get_mut("type") {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let t = types.remove(0);
                prop["type"] = t;
            }
        }
    }
}

/// Arguments of a tool that takes none (`additionalProperties: false`).
#[derive(Debug, serde::Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("properties" = {}))]
pub struct NoArgs {}

impl ToolArgs for NoArgs {
    type Checked = ();

    fn check(&self) -> Result<(), ArgError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn uids_follow_the_one_rule_of_ids() {
        assert!(uid("chunk_uid", "chk_0a1b").is_ok());
        let e = uid("library_uid", "lib a").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Invalid argument `library_uid`: must be 1-64 characters of letters, digits, _ - . :"
        );
        assert!(opt_uid("collection_uid", &Some("ü".into())).is_err());
        assert!(opt_uid("collection_uid", &None).is_ok());
    }

    #[derive(Debug, serde::Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Probe {
        query: String,
        #[allow(dead_code)]
        limit: Option<i64>,
        #[allow(dead_code)]
        uids: Option<Vec<String>>,
    }

    impl ToolArgs for Probe {
        type Checked = ();

        fn check(&self) -> Result<(), ArgError> {
            text("query", &self.query, Len { min: 1, max: 10 })
        }
    }

    fn err(v: Value) -> String {
        parse::<Probe>(v.as_object().unwrap().clone()).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_argument() {
        assert_eq!(
            err(json!({"query": "a", "x": 1})),
            "Invalid argument `x`: unknown argument"
        );
        assert_eq!(err(json!({})), "Invalid argument `query`: is required");
        assert_eq!(err(json!({"query": null})), "Invalid argument `query`: is required");
        assert_eq!(
            err(json!({"query": "  "})),
            "Invalid argument `query`: must be at least 1 non-blank character(s)"
        );
        assert_eq!(
            err(json!({"query": "x".repeat(11)})),
            "Invalid argument `query`: must be at most 10 characters"
        );
        assert!(err(json!({"query": "a", "limit": "5"})).starts_with("Invalid argument `limit`: invalid type"));
        assert!(err(json!({"query": "a", "uids": "x"})).starts_with("Invalid argument `uids`: invalid type"));
        assert!(err(json!({"query": "a", "uids": ["a", 5]})).starts_with("Invalid argument `uids`: [1]: invalid type"));
        // null is absent for an optional argument
        assert!(parse::<Probe>(json!({"query": "a", "limit": null}).as_object().unwrap().clone()).is_ok());
        assert!(parse::<NoArgs>(JsonObject::new()).is_ok());
        assert_eq!(
            parse::<NoArgs>(json!({"x": 1}).as_object().unwrap().clone())
                .unwrap_err()
                .to_string(),
            "Invalid argument `x`: unknown argument"
        );
    }

    #[test]
    fn integers_default_and_stay_in_range() {
        let r = Range {
            min: 1,
            max: 50,
            default: 10,
        };
        assert_eq!(int("limit", None, r), Ok(10));
        assert_eq!(int("limit", Some(50), r), Ok(50));
        assert_eq!(
            int("limit", Some(51), r).unwrap_err().to_string(),
            "Invalid argument `limit`: must be an integer from 1 to 50"
        );
    }
}
