//! `--api-key`: a Bearer key on every route but `/health`, compared in
//! constant time ([`subtle`]), so that the time of a refusal does not tell
//! how much of a guess was right.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::api::ApiError;

/// Whether `header` (the `Authorization` value) carries `key`.
pub fn key_matches(header: Option<&[u8]>, key: &[u8]) -> bool {
    let Some(got) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else { return false };
    got.ct_eq(key).into()
}

/// Middleware: a 401 in OpenAI's shape unless the request has the key
/// (no key configured: everything passes).
pub async fn require_key(State(key): State<Option<Arc<str>>>, req: Request, next: Next) -> Response {
    if let Some(key) = key {
        let header = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
        if !key_matches(header, key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_key_passes() {
        assert!(key_matches(Some(b"Bearer sekrit"), b"sekrit"));
        assert!(!key_matches(Some(b"Bearer sekri"), b"sekrit"));
        assert!(!key_matches(Some(b"Bearer sekrit2"), b"sekrit"));
        assert!(!key_matches(Some(b"sekrit"), b"sekrit"));
        assert!(!key_matches(Some(b"Basic sekrit"), b"sekrit"));
        assert!(!key_matches(None, b"sekrit"));
    }
}
