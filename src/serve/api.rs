//! Request bodies and errors of the HTTP API: text-embeddings-inference's `POST /embed` and
//! OpenAI's `POST /v1/embeddings`. Bodies are read as JSON values and checked field by field, so
//! that every malformed request gets a one-line message naming the field at fault (serde's
//! untagged-enum errors say only "did not match any variant").

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

/// An error answer: its status and a JSON body `{"error": message, "error_type": kind}` (the
/// shape text-embeddings-inference uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header (503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, message: message.into(), retry_after: None }
    }
    /// 422: the body is not what the route takes.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "validation", message)
    }
    /// 413: more inputs, or longer ones, than the server takes.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "validation", message)
    }
    /// 503 with Retry-After: the queue is full, or the server is shutting down.
    pub fn overloaded(message: impl Into<String>) -> Self {
        ApiError { retry_after: Some(1), ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message) }
    }
    /// 500: the engine failed.
    pub fn backend(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "backend", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message, "error_type": self.kind });
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// The body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::validation("the body must be a JSON object")),
        Err(e) => Err(ApiError::validation(format!("the body is not valid JSON: {e}"))),
    }
}

/// A field that is a string or an array of strings.
pub fn texts(obj: &Map<String, Value>, key: &str) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::validation(format!("`{key}` must be a string or an array of strings"));
    match obj.get(key) {
        None | Some(Value::Null) => Err(ApiError::validation(format!("missing field `{key}`"))),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => {
            if a.is_empty() {
                return Err(ApiError::validation(format!("`{key}` is an empty array")));
            }
            a.iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(ApiError::validation(format!("`{key}[{i}]` must be a string"))),
                })
                .collect()
        }
        Some(_) => Err(bad()),
    }
}

/// An optional boolean field.
pub fn flag(obj: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::validation(format!("`{key}` must be true or false"))),
    }
}

/// An optional string field.
pub fn string<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::validation(format!("`{key}` must be a string"))),
    }
}

/// OpenAI's `encoding_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Float,
    /// Little-endian f32 bytes, base64 (standard alphabet, padded), as OpenAI sends them.
    Base64,
}

pub fn encoding(obj: &Map<String, Value>) -> Result<Encoding, ApiError> {
    match string(obj, "encoding_format")? {
        None | Some("float") => Ok(Encoding::Float),
        Some("base64") => Ok(Encoding::Base64),
        Some(o) => Err(ApiError::validation(format!("`encoding_format` is \"float\" or \"base64\", not {o:?}"))),
    }
}

/// The base64 text of an embedding's little-endian f32 bytes.
pub fn base64_f32(v: &[f32]) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_checked_with_messages_naming_them() {
        assert_eq!(object(b"[1]").unwrap_err().message, "the body must be a JSON object");
        assert!(object(b"{").unwrap_err().message.starts_with("the body is not valid JSON"));
        let o = object(br#"{"inputs": ["a", 3], "normalize": "yes", "encoding_format": "hex"}"#).unwrap();
        assert_eq!(texts(&o, "inputs").unwrap_err().message, "`inputs[1]` must be a string");
        assert_eq!(texts(&o, "input").unwrap_err().message, "missing field `input`");
        assert_eq!(flag(&o, "normalize", true).unwrap_err().message, "`normalize` must be true or false");
        assert_eq!(flag(&o, "truncate", false), Ok(false));
        assert!(encoding(&o).unwrap_err().message.contains("not \"hex\""));
        let o = object(br#"{"inputs": "one", "x": {}}"#).unwrap();
        assert_eq!(texts(&o, "inputs").unwrap(), vec!["one".to_string()]);
        assert_eq!(texts(&object(br#"{"inputs": []}"#).unwrap(), "inputs").unwrap_err().message, "`inputs` is an empty array");
        assert_eq!(texts(&object(br#"{"inputs": 5}"#).unwrap(), "inputs").unwrap_err().status, StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[test]
    fn base64_is_little_endian_f32() {
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
    }
}
