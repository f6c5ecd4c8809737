//! An OpenAI-compatible chat-completions [`Model`] (cargo feature `openai`):
//! [`OpenAiModel`] and its [`OpenAiConfig`], re-exported by the `turnstile`
//! crate as `turnstile::OpenAiModel` and `turnstile::OpenAiConfig`.
//!
//! The request is built from the transcript as JSON values; the response is
//! read leniently (missing or null fields are defaults) into wire structs;
//! a streamed response goes through a small server-sent-events parser that
//! buffers across chunk boundaries and an assembler for tool-call fragments.
//! Behaviour, errors and timeouts are documented on [`OpenAiModel`].

mod config;
mod errors;
mod extra;
mod request;
mod stream;
mod wire;

use std::fmt;
use std::time::Instant;

use async_trait::async_trait;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};

use turnstile_core::agent::{Model, ModelRequest, ModelResponse};
use turnstile_core::ModelError;

pub use config::{OpenAiConfig, ReasoningReplay};
pub use turnstile_model_http::{redacted_url, RetryPolicy};

use turnstile_model_http::{
    chain, decode_error, endpoint_url, excerpt, is_json, read_body, retry_after, with_retries,
    BodyError, Failure, ShownText,
};

use errors::{status_error, transport_error};
use wire::Completion;

/// The largest non-streamed response body accepted.
const MAX_BODY_BYTES: usize = 32 << 20;

/// A [`Model`] backed by an OpenAI-compatible chat-completions endpoint
/// (cargo feature `openai`).
///
/// It sends `POST {base_url}/chat/completions` the way the OpenAI API
/// defines it, so it works with OpenAI itself and with the servers that speak
/// the same protocol (llama.cpp, vLLM, Ollama, LM Studio, hosted gateways).
///
/// - Without a delta callback ([`ModelRequest::deltas`] is `None`) a call is
///   one JSON request and one JSON response.
/// - With a delta callback the call is streamed as server-sent events: every
///   text delta goes to the callback as it arrives, tool calls are assembled
///   from their fragments, and usage comes from the final chunk
///   (`stream_options.include_usage`). A stream that ends without
///   `data: [DONE]` is a truncated response and fails.
/// - An answer the model was not let finish is a fatal error, not an
///   answer: `finish_reason` `length` (cut off at
///   [`max_output_tokens`](OpenAiConfig::max_output_tokens) or the context
///   size) or `content_filter`. Its text may stop mid-sentence and its last
///   tool call mid-arguments, so it is discarded whole and none of its tool
///   calls runs; an agent run stops with the model error, resumable.
/// - [`OpenAiConfig::extra_body`] adds members to every request, e.g.
///   `temperature` or `tool_choice`.
/// - The API key is sent as `Authorization: Bearer …`. It never appears in
///   `Debug` output, logs or error messages; a server that echoes it back in
///   an error body has it replaced by `[redacted]`.
/// - Failures are classified through [`ModelError::retryable`]: rate limits
///   (429), request timeouts (408), server errors (5xx), connection failures,
///   dropped connections and timeouts may pass on retry; other 4xx answers
///   and malformed or truncated responses will not.
/// - A 429, 408 or 5xx answer, and an answer that breaks off (or reports an
///   error the server may get past) before any of its text was shown, is
///   sent again after the server's `retry-after` or a doubling backoff
///   ([`OpenAiConfig::retry`]), but never past the run's deadline
///   ([`ModelRequest::deadline`]): a wait that would pass it fails at once,
///   retryable, saying so. An answer whose text was shown is not sent again
///   (the text would show twice), and a call that could not be sent or got
///   no response within the timeout is not either: the run stops, resumable.
/// - Logging uses `tracing` at debug level: sizes, status codes, timings and
///   token counts, never message contents.
///
/// Its [`Model::name`] is `openai:<model>`, so the agent fingerprint changes
/// with the model name but not with the endpoint or key. Share one instance
/// (`Arc<dyn Model>`): the HTTP connection pool is reused across calls.
///
/// # Timeouts
///
/// [`OpenAiConfig::timeout`] bounds connecting and every wait for data from
/// the server. A non-streamed call must also complete within it. A streamed
/// call may take longer in total, as long as the server keeps sending: only
/// each silence is bounded.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use turnstile::{Agent, OpenAiConfig, OpenAiModel};
///
/// # fn main() -> Result<(), turnstile::ModelError> {
/// let config = OpenAiConfig::from_env(
///     "https://api.openai.com/v1",
///     "gpt-4o-mini",
///     "OPENAI_API_KEY",
/// )?
/// .with_max_output_tokens(1024);
/// let agent = Agent::new(Arc::new(OpenAiModel::new(config)?))
///     .with_system_prompt("You are terse.");
/// # let _ = agent;
/// # Ok(())
/// # }
/// ```
pub struct OpenAiModel {
    name: String,
    config: OpenAiConfig,
    endpoint: reqwest::Url,
    authorization: Option<HeaderValue>,
    client: reqwest::Client,
}

impl OpenAiModel {
    /// A model for `config`. Nothing is sent until the first call.
    ///
    /// # Errors
    /// A fatal [`ModelError`] when the model name is empty, the timeout is
    /// zero, the extra body names a
    /// [reserved member](OpenAiConfig::RESERVED_BODY_MEMBERS), the base URL
    /// is not an `http`/`https` URL, the key cannot be sent in an HTTP
    /// header, or the HTTP client cannot be built.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        if config.model.trim().is_empty() {
            return Err(ModelError::fatal("the openai model name is empty"));
        }
        if config.timeout.is_zero() {
            return Err(ModelError::fatal("the openai timeout must be positive"));
        }
        if let Some(name) = OpenAiConfig::RESERVED_BODY_MEMBERS
            .into_iter()
            .find(|name| config.extra_body.contains_key(*name))
        {
            return Err(ModelError::fatal(format!(
                "the extra request body member {name:?} is set by the openai model itself"
            )));
        }
        let endpoint = endpoint_url(&config.base_url, "/chat/completions", "openai")?;
        let authorization = match config.key() {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                    ModelError::fatal(
                        "the api key contains characters not allowed in an http header",
                    )
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let client = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            .read_timeout(config.timeout)
            .build()
            .map_err(|e| {
                ModelError::fatal(format!("cannot build the http client: {}", chain(&e)))
            })?;
        Ok(Self {
            name: format!("openai:{}", config.model),
            config,
            endpoint,
            authorization,
            client,
        })
    }

    /// The configuration the model was built with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The URL requests are sent to: `{base_url}/chat/completions`.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// One answer: the request, then the answer read as one JSON body or as
    /// an event stream; sent again as [`OpenAiConfig::retry`] allows.
    async fn call(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let body = request::request_body(&self.config, request, request.deltas.is_some());
        // A body always serializes: its JSON is built from values.
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let caller = request.deltas;
        with_retries(self.config.retry, request.deadline, "openai", || async {
            let mut builder = self
                .client
                .post(self.endpoint.clone())
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(authorization) = &self.authorization {
                builder = builder.header(AUTHORIZATION, authorization.clone());
            }
            builder = match caller {
                Some(_) => builder.header(ACCEPT, "text/event-stream"),
                None => builder.timeout(self.config.timeout),
            };
            let response = builder.send().await.map_err(|e| {
                Failure::Stop(transport_error(&self.config, e, "waiting for the response"))
            })?;
            let status = response.status();
            tracing::debug!(
                status = status.as_u16(),
                "chat completions endpoint answered"
            );
            if !status.is_success() {
                let wait = retry_after(response.headers());
                let error = status_error(&self.config, response).await;
                return Err(Failure::of_status(status, error, wait));
            }
            let shown = ShownText::new(caller);
            let read = match caller {
                // A server that ignores `stream` answers with one JSON body:
                // its text becomes a single delta.
                Some(_) if is_json(&response) => {
                    self.read_completion(response).await.inspect(|answer| {
                        let text = answer.content.text();
                        if !text.is_empty() {
                            shown.show(&text);
                        }
                    })
                }
                Some(_) => {
                    stream::read_stream(&self.config, response, &|text| shown.show(text)).await
                }
                None => self.read_completion(response).await,
            };
            read.map_err(|error| Failure::of_read(error, &shown))
        })
        .await
    }

    /// Reads a non-streamed answer: a bounded body, decoded leniently.
    async fn read_completion(
        &self,
        mut response: reqwest::Response,
    ) -> Result<ModelResponse, ModelError> {
        // Named in parse errors: an HTML page usually means a wrong base URL.
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.contains("json"))
            .map(|v| format!(" (content-type {})", excerpt(v, 60)))
            .unwrap_or_default();
        let body = read_body(&mut response, MAX_BODY_BYTES)
            .await
            .map_err(|e| match e {
                BodyError::TooLarge => ModelError::fatal(format!(
                    "the chat completion response exceeds {} MiB",
                    MAX_BODY_BYTES >> 20
                )),
                BodyError::Transport(e) => transport_error(&self.config, e, "reading the response"),
            })?;
        let completion: Completion = serde_json::from_slice(&body).map_err(|e| {
            let detail = decode_error(&e, "a chat completion object");
            if e.is_eof() {
                ModelError::fatal(format!(
                    "truncated chat completion response ({} bytes): {detail}",
                    body.len()
                ))
            } else {
                ModelError::fatal(format!(
                    "malformed chat completion response{content_type}: {detail}"
                ))
            }
        })?;
        completion.into_response(&self.config)
    }
}

impl fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("name", &self.name)
            .field("endpoint", &redacted_url(self.endpoint.as_str()))
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    /// One chat completion, streamed when the request has a delta callback.
    ///
    /// # Errors
    /// A retryable [`ModelError`] for 429, 408 and 5xx answers, connection
    /// failures, dropped connections and timeouts; a fatal one for other
    /// answers, malformed or truncated responses, tool calls without a name,
    /// and answers cut off (`finish_reason` `length`) or filtered
    /// (`content_filter`). Messages carry the status and a short excerpt of
    /// the server's error text, never the API key.
    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let started = Instant::now();
        tracing::debug!(
            model = %self.config.model,
            messages = request.messages.len(),
            tools = request.tools.len(),
            stream = request.deltas.is_some(),
            "chat completion request"
        );
        let result = self.call(&request).await;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(response) => tracing::debug!(
                elapsed_ms,
                input_tokens = response.usage.input_tokens,
                output_tokens = response.usage.output_tokens,
                cache_read_tokens = response.usage.cache_read_tokens,
                tool_calls = response.tool_calls.len(),
                "chat completion done"
            ),
            Err(e) => tracing::debug!(
                elapsed_ms,
                retryable = e.retryable,
                "chat completion failed"
            ),
        }
        result
    }
}
