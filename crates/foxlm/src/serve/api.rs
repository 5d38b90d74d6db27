//! Parsing and checking request bodies by hand (not with derived serde types), so every error names
//! the field at fault in an OpenAI-style error object.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None }
    }
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// A JSON object body, field by field.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Field `name` holds `v` where `want` was expected.
fn wrong_type(name: &str, want: &str, v: &Value) -> ApiError {
    ApiError::invalid(name, format!("'{name}' must be {want}, not {}", type_name(v)))
}

impl<'a> Fields<'a> {
    pub fn parse(body: &'a Value) -> Result<Self, ApiError> {
        match body {
            Value::Object(map) => Ok(Self { map }),
            other => Err(ApiError::invalid(
                "body",
                format!("the request body must be a JSON object, not {}", type_name(other)),
            )),
        }
    }

    /// The names of the fields present (null ones included).
    pub fn keys(&self) -> impl Iterator<Item = &'a str> {
        self.map.keys().map(|k| k.as_str())
    }

    /// The field's value; null counts as absent.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub fn bool(&self, name: &str, default: bool) -> Result<bool, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(wrong_type(name, "a boolean", v)),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(name, "a string", v)),
        }
    }

    pub fn f64(&self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| ApiError::invalid(name, format!("'{name}' is not a finite number"))),
            Some(v) => Err(wrong_type(name, "a number", v)),
        }
    }

    /// An integer in `lo..=hi`.
    pub fn int(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let i = n
                    .as_i64()
                    .ok_or_else(|| ApiError::invalid(name, format!("'{name}' must be an integer, got {n}")))?;
                if i < lo || i > hi {
                    return Err(ApiError::invalid(name, format!("'{name}' must be between {lo} and {hi}, got {i}")));
                }
                Ok(Some(i))
            }
            Some(v) => Err(wrong_type(name, "an integer", v)),
        }
    }

    /// A seed: any integer that fits 64 bits (negative ones are taken modulo 2^64).
    pub fn seed(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .or_else(|| n.as_i64().map(|i| i as u64))
                .map(Some)
                .ok_or_else(|| ApiError::invalid(name, format!("'{name}' must be a 64-bit integer, got {n}"))),
            Some(v) => Err(wrong_type(name, "an integer", v)),
        }
    }

    /// A string or a list of strings.
    pub fn strings(&self, name: &str) -> Result<Vec<String>, ApiError> {
        match self.get(name) {
            None => Ok(vec![]),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(ApiError::invalid(name, format!("'{name}[{i}]' must be a string, not {}", type_name(v)))),
                })
                .collect(),
            Some(v) => Err(wrong_type(name, "a string or a list of strings", v)),
        }
    }
}

/// A prompt as the client gave it.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// One token id: a non-negative integer below `vocab`.
fn token_id(v: &Value, field: &str, vocab: usize) -> Result<u32, ApiError> {
    match v.as_u64() {
        Some(id) if (id as usize) < vocab && id <= u32::MAX as u64 => Ok(id as u32),
        Some(id) => Err(ApiError::invalid(
            field,
            format!("{field}: token id {id} is outside the model's vocabulary of {vocab}"),
        )),
        None => Err(ApiError::invalid(field, format!("{field}: a token id must be a non-negative integer, got {v}"))),
    }
}

/// A list of token ids, each below `vocab`.
pub fn token_ids(v: &Value, field: &str, vocab: usize) -> Result<Vec<u32>, ApiError> {
    match v {
        Value::Array(a) => a.iter().enumerate().map(|(i, x)| token_id(x, &format!("{field}[{i}]"), vocab)).collect(),
        other => {
            Err(ApiError::invalid(field, format!("'{field}' must be a list of token ids, not {}", type_name(other))))
        }
    }
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
pub fn prompts(f: &Fields, vocab: usize) -> Result<Vec<Prompt>, ApiError> {
    let bad = |what: &str| ApiError::invalid("prompt", format!("'prompt' {what}"));
    let Some(v) = f.get("prompt") else {
        return Err(bad("is required"));
    };
    match v {
        Value::String(s) => Ok(vec![Prompt::Text(s.clone())]),
        Value::Array(a) if a.is_empty() => Err(bad("must not be an empty list")),
        Value::Array(a) => match &a[0] {
            Value::String(_) => a
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::String(s) => Ok(Prompt::Text(s.clone())),
                    x => Err(bad(&format!("mixes strings with {} (at index {i})", type_name(x)))),
                })
                .collect(),
            Value::Number(_) => Ok(vec![Prompt::Ids(token_ids(v, "prompt", vocab)?)]),
            Value::Array(_) => a
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let ids = token_ids(x, &format!("prompt[{i}]"), vocab)?;
                    if ids.is_empty() {
                        return Err(bad(&format!("[{i}] is an empty list of token ids")));
                    }
                    Ok(Prompt::Ids(ids))
                })
                .collect(),
            x => Err(bad(&format!(
                "must be a string, a list of strings, a list of token ids or a list of lists of token ids; its first element is {}",
                type_name(x)
            ))),
        },
        x => Err(bad(&format!("must be a string or a list, not {}", type_name(x)))),
    }
}
