//! What turnstile's HTTP model clients (`turnstile-openai`,
//! `turnstile-anthropic`) share, so that each is written once:
//!
//! - [`SseParser`]: a bounded server-sent-events parser;
//! - [`api_key_from_env`], [`redact`] and [`redacted_url`]: keys read from
//!   the environment and kept out of messages;
//! - [`excerpt`], [`chain`], [`decode_error`], [`json_kind`]: error text
//!   that never quotes model output;
//! - [`endpoint_url`], [`is_json`], [`read_body`], [`error_body`],
//!   [`retryable_status`], [`transport_error`]: the edges of the HTTP
//!   exchange;
//! - [`RetryPolicy`], [`with_retries`], [`retry_after`], [`Failure`],
//!   [`ShownText`]: sending a call again after a failure that may pass.

mod key;
mod response;
mod retry;
mod sse;
mod text;

pub use key::{api_key_from_env, redact, redacted_url, Redacted};
pub use response::{
    endpoint_url, error_body, is_json, read_body, retryable_status, transport_error, BodyError,
    EXCERPT_CHARS,
};
pub use retry::{retry_after, with_retries, Failure, RetryPolicy, ShownText};
pub use sse::{SseEvent, SseParser};
pub use text::{chain, decode_error, excerpt, json_kind};
