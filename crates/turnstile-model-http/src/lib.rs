//! What turnstile's HTTP model clients (`turnstile-openai`,
//! `turnstile-anthropic`) share, so that each is written once:
//!
//! - [`SseParser`]: a bounded server-sent-events parser;
//! - [`api_key_from_env`], [`redact`] and [`redacted_url`]: keys read from
//!   the environment and kept out of messages;
//! - [`excerpt`], [`chain`], [`decode_error`], [`json_kind`]: error text
//!   that never quotes model output.

mod key;
mod sse;
mod text;

pub use key::{api_key_from_env, redact, redacted_url, Redacted};
pub use sse::{SseEvent, SseParser};
pub use text::{chain, decode_error, excerpt, json_kind};
