//! A request's body, read whole before its route runs: within its size
//! limit (`413` past it) and its deadline (`408` past it, so a client
//! sending it a byte at a time holds nothing for long). Nothing is written
//! before it is read.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::errors::ApiError;
use crate::Server;

pub(crate) async fn read_whole(
    State(server): State<Server>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let limited = Limited::new(body, server.body_limit());
    let bytes = match tokio::time::timeout(server.body_within, limited.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<LengthLimitError>() => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is over {} bytes", server.body_limit()),
                "send a shorter input; nothing was written",
            )
            .into_response();
        }
        Ok(Err(_)) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "unreadable_body",
                "the body could not be read",
                "send the request again, whole; nothing was written",
            )
            .into_response();
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the body did not arrive within {} s",
                    server.body_within.as_secs_f64()
                ),
                "send the request again, whole and at once; nothing was written",
            )
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
