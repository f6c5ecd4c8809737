//! An Anthropic Messages API [`Model`] (cargo feature `anthropic`):
//! [`AnthropicModel`] and its [`AnthropicConfig`], re-exported by the
//! `turnstile` crate.
//!
//! Written here rather than taken from a crate: Anthropic publishes no Rust
//! SDK, and the part a durable engine must get right, thinking blocks sent
//! back byte for byte with their signatures after a crash, is the part a
//! generic client would not promise. The request is built in `request`,
//! answers are read in `wire` (whole) and `stream` (server-sent events,
//! through the parser shared with the OpenAI client), and retries go through
//! the policy shared with it too (`turnstile_model_http::with_retries`).

mod config;
mod errors;
mod request;
mod stream;
mod wire;

use std::fmt;
use std::time::Instant;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};

use turnstile_core::agent::{Model, ModelRequest, ModelResponse};
use turnstile_core::message::Usage;
use turnstile_core::ModelError;
use turnstile_model_http::{
    chain, decode_error, endpoint_url, is_json, read_body, redacted_url, retry_after, with_retries,
    BodyError, Failure, ShownText,
};

pub use config::{AnthropicConfig, PromptCache};
pub use turnstile_model_http::RetryPolicy;

use errors::{status_error, transport_error};
use request::{RequestBody, WireMessage};
use wire::{check_stop, into_response, AnswerBlock, WireResponse};

/// The largest non-streamed response body accepted.
const MAX_BODY_BYTES: usize = 32 << 20;
/// How many times one answer may pause (`pause_turn`) and be continued.
const MAX_CONTINUATIONS: usize = 8;

/// A [`Model`] backed by the Anthropic Messages API (cargo feature
/// `anthropic`): `POST {base_url}/v1/messages`.
///
/// - **Streaming.** Every call is streamed as server-sent events (the API's
///   advice for answers that may take minutes, as thinking does); with a
///   delta callback ([`ModelRequest::deltas`]) every text delta goes to it
///   as it arrives. A stream that ends before `message_stop` fails
///   (retryable). A server that answers with one JSON body is read too, and
///   [`AnthropicConfig::with_streaming`]`(false)` asks for one (the whole
///   call then within the timeout).
/// - **Tools.** Tool specs go as `tools` with their JSON schema as
///   `input_schema`; `tool_use` blocks come back as tool calls (their input
///   kept as the JSON text the model wrote), tool results go as
///   `tool_result` blocks with their text and images, `is_error` set for a
///   failed call. An answer goes back as its text and reasoning in their
///   order, then its tool calls.
/// - **Images and documents.** A user message's images go as `image`
///   blocks (base64, or the image's URL), its PDFs and text files as
///   `document` blocks; a tool result's images as images. Other files, and
///   images elsewhere, go as their placeholders (`[image: image/png, 34
///   KiB]`).
/// - **Extended thinking** ([`AnthropicConfig::thinking_budget`]):
///   `thinking` and `redacted_thinking` blocks become reasoning parts
///   (provider `anthropic`) holding the text and signature, or the
///   redacted data, and are sent back exactly, in their place, with the
///   answer that produced them. The API requires this within a tool loop;
///   a run resumed after a crash sends what the checkpoint stored. Earlier
///   requests' reasoning follows the session's `PastReasoning` (by default a
///   placeholder, which sends nothing).
/// - **Prompt caching** ([`AnthropicConfig::prompt_cache`]): breakpoints on
///   the system prompt, the tools and the latest turn;
///   `cache_creation_input_tokens` and `cache_read_input_tokens` become
///   [`Usage::cache_write_tokens`] and [`Usage::cache_read_tokens`].
///   [`Usage::input_tokens`] counts every prompt token, cached or not.
/// - **Stop reasons.** `end_turn`, `tool_use` and `stop_sequence` are
///   answers. `max_tokens`, `refusal` and
///   `model_context_window_exceeded` are fatal errors: the incomplete
///   answer is discarded and none of its tool calls runs; the run stops
///   resumable. `pause_turn` (a server tool's long turn) is continued: the
///   paused answer's blocks are sent back (a server tool's blocks as they
///   came; text without its citations), up to 8 times, and the parts of
///   each continuation join the answer. What is stored of an answer is its
///   text, reasoning and tool calls: a server tool's blocks are not sent to
///   later turns.
/// - **Retries.** 429, 529 (overloaded) and other 5xx answers are tried
///   again after the server's `retry-after` or a
///   doubling backoff ([`RetryPolicy`]), but never past the run's deadline
///   ([`ModelRequest::deadline`]): a wait that would pass it fails at once,
///   retryable, saying so. Other 4xx answers fail at once and say which
///   ([`ModelError::status`]).
/// - The API key goes as `x-api-key`. It never appears in `Debug` output,
///   logs or error messages.
///
/// Its [`Model::name`] is `anthropic:<model>`.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use turnstile::{Agent, AnthropicConfig, AnthropicModel};
///
/// # fn main() -> Result<(), turnstile::ModelError> {
/// let config = AnthropicConfig::from_env("claude-sonnet-4-5", AnthropicConfig::DEFAULT_KEY_VAR)?
///     .with_max_tokens(16_000)
///     .with_thinking_budget(8_000);
/// let agent = Agent::new(Arc::new(AnthropicModel::new(config)?));
/// # let _ = agent;
/// # Ok(())
/// # }
/// ```
pub struct AnthropicModel {
    name: String,
    config: AnthropicConfig,
    endpoint: reqwest::Url,
    headers: HeaderMap,
    client: reqwest::Client,
}

impl AnthropicModel {
    /// A model for `config`. Nothing is sent until the first call.
    ///
    /// # Errors
    /// A fatal [`ModelError`] when the model name is empty, the timeout or
    /// `max_tokens` is zero, the thinking budget is not below
    /// `max_tokens`, the extra body names a
    /// [reserved member](AnthropicConfig::RESERVED_BODY_MEMBERS), the base
    /// URL is not `http`/`https`, a header value cannot be sent, or the HTTP
    /// client cannot be built.
    pub fn new(config: AnthropicConfig) -> Result<Self, ModelError> {
        config.check()?;
        let endpoint = endpoint_url(&config.base_url, "/v1/messages", "anthropic")?;
        let mut headers = HeaderMap::new();
        let header = |value: &str, what: &str| {
            HeaderValue::from_str(value).map_err(|_| {
                ModelError::fatal(format!(
                    "the {what} contains characters not allowed in an http header"
                ))
            })
        };
        headers.insert(
            "anthropic-version",
            header(&config.api_version, "anthropic version")?,
        );
        if !config.betas.is_empty() {
            headers.insert(
                "anthropic-beta",
                header(&config.betas.join(","), "beta list")?,
            );
        }
        if let Some(key) = config.key() {
            let mut value = header(key, "api key")?;
            value.set_sensitive(true);
            headers.insert("x-api-key", value);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            .read_timeout(config.timeout)
            .build()
            .map_err(|e| {
                ModelError::fatal(format!("cannot build the http client: {}", chain(&e)))
            })?;
        Ok(Self {
            name: format!("anthropic:{}", config.model),
            config,
            endpoint,
            headers,
            client,
        })
    }

    /// The configuration the model was built with.
    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }

    /// The URL requests are sent to: `{base_url}/v1/messages`.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// One answer: exchanges until it is not paused.
    async fn answer(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let mut body = request::request_body(&self.config, request);
        let mut blocks = Vec::new();
        let mut usage = Usage::default();
        for _ in 0..=MAX_CONTINUATIONS {
            let (answer, stop_reason, answer_usage) = self.exchange(&body, request).await?;
            usage = usage.saturating_add(answer_usage);
            // A cut or refused answer is discarded; the tokens it spent count.
            check_stop(stop_reason.as_deref(), self.config.max_tokens)
                .map_err(|e| e.with_usage(usage))?;
            let paused = stop_reason.as_deref() == Some("pause_turn");
            if paused {
                // Sent back as it came, for the model to go on from.
                let sent: Vec<_> = answer.iter().map(AnswerBlock::to_raw).collect();
                body.messages.push(WireMessage::assistant(sent));
            }
            blocks.extend(answer);
            if !paused {
                return into_response(blocks, usage);
            }
            tracing::debug!("anthropic answer paused; continuing it");
        }
        // A resume would ask again from the start and likely pause the same
        // way: not worth retrying as it is.
        Err(ModelError::fatal(format!(
            "the anthropic answer paused {} times in a row (stop_reason pause_turn); \
             the incomplete answer was discarded",
            MAX_CONTINUATIONS + 1
        )))
    }

    /// One exchange, streamed unless the configuration says otherwise:
    /// text deltas go to the caller's callback when it has one. Tried again
    /// as [`RetryPolicy`] allows.
    async fn exchange(
        &self,
        body: &RequestBody<'_>,
        request: &ModelRequest<'_>,
    ) -> Result<(Vec<AnswerBlock>, Option<String>, Usage), ModelError> {
        // A body always serializes: its JSON is built from values.
        let body = serde_json::to_vec(body).unwrap_or_default();
        let caller = request.deltas;
        with_retries(self.config.retry, request.deadline, "anthropic", || async {
            let builder = self
                .client
                .post(self.endpoint.clone())
                .headers(self.headers.clone())
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            let builder = match self.config.stream {
                true => builder.header(ACCEPT, "text/event-stream"),
                false => builder.timeout(self.config.timeout),
            };
            let response = builder.send().await.map_err(|e| {
                Failure::Stop(transport_error(&self.config, e, "waiting for the response"))
            })?;
            let status = response.status();
            if !status.is_success() {
                let wait = retry_after(response.headers());
                let error = status_error(&self.config, response).await;
                return Err(Failure::of_status(status, error, wait));
            }
            let shown = ShownText::new(caller);
            let read = if is_json(&response) {
                // A server that ignores `stream` answers with one body.
                self.read_response(response)
                    .await
                    .inspect(|(blocks, _, _)| {
                        for block in blocks {
                            if let AnswerBlock::Text(text) = block {
                                shown.show(text);
                            }
                        }
                    })
            } else {
                stream::read_stream(&self.config, response, &|text| shown.show(text))
                    .await
                    .map(|s| (s.blocks, s.stop_reason, s.usage.into_usage()))
            };
            read.map_err(|error| Failure::of_read(error, &shown))
        })
        .await
    }

    /// Reads a non-streamed answer: a bounded body, decoded leniently.
    async fn read_response(
        &self,
        mut response: reqwest::Response,
    ) -> Result<(Vec<AnswerBlock>, Option<String>, Usage), ModelError> {
        let body = read_body(&mut response, MAX_BODY_BYTES)
            .await
            .map_err(|e| match e {
                BodyError::TooLarge => ModelError::fatal(format!(
                    "the anthropic response exceeds {} MiB",
                    MAX_BODY_BYTES >> 20
                )),
                BodyError::Transport(e) => transport_error(&self.config, e, "reading the response"),
            })?;
        let answer: WireResponse = serde_json::from_slice(&body).map_err(|e| {
            let detail = decode_error(&e, "a message object");
            if e.is_eof() {
                ModelError::retryable(format!(
                    "truncated anthropic response ({} bytes): {detail}",
                    body.len()
                ))
            } else {
                ModelError::fatal(format!("malformed anthropic response: {detail}"))
            }
        })?;
        let blocks = answer
            .content
            .unwrap_or_default()
            .into_iter()
            .map(AnswerBlock::read)
            .collect::<Result<_, _>>()?;
        Ok((
            blocks,
            answer.stop_reason,
            answer.usage.unwrap_or_default().into_usage(),
        ))
    }
}

impl fmt::Debug for AnthropicModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicModel")
            .field("name", &self.name)
            .field("endpoint", &redacted_url(self.endpoint.as_str()))
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Model for AnthropicModel {
    fn name(&self) -> &str {
        &self.name
    }

    /// One answer, streamed when the request has a delta callback.
    ///
    /// # Errors
    /// A retryable [`ModelError`] for rate limits, overloads and server
    /// errors left after the retries, connection failures, dropped or cut
    /// streams and timeouts; a fatal one for other 4xx answers, malformed
    /// responses, and answers cut off (`max_tokens`,
    /// `model_context_window_exceeded`) or refused (`refusal`).
    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let started = Instant::now();
        tracing::debug!(
            model = %self.config.model,
            messages = request.messages.len(),
            tools = request.tools.len(),
            stream = request.deltas.is_some(),
            "anthropic messages request"
        );
        let result = self.answer(&request).await;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(response) => tracing::debug!(
                elapsed_ms,
                input_tokens = response.usage.input_tokens,
                output_tokens = response.usage.output_tokens,
                cache_read_tokens = response.usage.cache_read_tokens,
                cache_write_tokens = response.usage.cache_write_tokens,
                tool_calls = response.tool_calls.len(),
                "anthropic messages done"
            ),
            Err(e) => tracing::debug!(
                elapsed_ms,
                retryable = e.retryable,
                "anthropic messages failed"
            ),
        }
        result
    }
}
