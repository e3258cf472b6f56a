//! OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`
//! with an HTTP status, for every refusal of the server (bad JSON, a bad
//! field, an unknown model, a full queue, a missing key).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error response (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's `type` (`invalid_request_error`, `authentication_error`,
    /// `server_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`...).
    pub code: Option<&'static str>,
}

/// A result whose error is an [`ApiError`].
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// A 400 `invalid_request_error` about field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// A 400 about the request as a whole (no one field).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError { param: None, ..ApiError::invalid("", message) }
    }

    /// A 400 naming a field that this server does not implement.
    pub fn unsupported(param: &str, what: &str) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::invalid(param, format!("{param}: {what} is not supported by this server"))
        }
    }

    /// The same error with `code`.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// A 404 for a model other than the one served.
    pub fn model_not_found(name: &str, served: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("model_not_found"),
            ..ApiError::invalid("model", format!("the model `{name}` does not exist; this server serves `{served}`"))
        }
    }

    /// A 503: the queue is full.
    pub fn overloaded() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is busy: too many requests are waiting; try again later".into(),
            kind: "server_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// A 500 from the engine or the model.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// A 401: the API key is missing or wrong.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or invalid API key (send `Authorization: Bearer KEY`)".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// A 404 for a path this server has no route for.
    pub fn no_route(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no route for {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("unknown_url"),
        }
    }

    /// A route that exists, called with another method (405).
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("{path} does not take {method}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
        }
    }

    /// The JSON body (also sent as the last event of a stream that fails).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
