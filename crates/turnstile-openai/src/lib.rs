//! An OpenAI-compatible chat-completions [`Model`] (cargo feature `openai`):
//! [`OpenAiModel`] and its [`OpenAiConfig`], re-exported by the `turnstile`
//! crate as `turnstile::OpenAiModel` and `turnstile::OpenAiConfig`.
//!
//! The request is built from the transcript as JSON values; the response is
//! read leniently (missing or null fields are defaults) into wire structs;
//! a streamed response goes through a small server-sent-events parser that
//! buffers across chunk boundaries and an assembler for tool-call fragments.
//! Behaviour, errors and timeouts are documented on [`OpenAiModel`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::error::Category;
use serde_json::{json, Map, Value};

use turnstile_core::agent::{Model, ModelRequest, ModelResponse, TextDeltas};
use turnstile_core::message::{Message, ToolCall, ToolSpec, Usage};
use turnstile_core::ModelError;

/// The largest non-streamed response body accepted.
const MAX_BODY_BYTES: usize = 32 << 20;
/// The largest single server-sent event accepted.
const MAX_EVENT_BYTES: usize = 8 << 20;
/// How much of an error body is read.
const MAX_ERROR_BODY_BYTES: usize = 16 << 10;
/// How many characters of a server's error text go into a [`ModelError`].
const EXCERPT_CHARS: usize = 300;

/// Where and how to reach an OpenAI-compatible endpoint.
///
/// Build it with [`OpenAiConfig::new`] or [`OpenAiConfig::from_env`] and the
/// `with_*` methods. `Debug` prints the key as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// The API root, e.g. `https://api.openai.com/v1` or
    /// `http://127.0.0.1:8080/v1`; `/chat/completions` is appended.
    pub base_url: String,
    /// The model name sent with every request, e.g. `gpt-4o-mini`.
    pub model: String,
    /// Sent as `Authorization: Bearer <key>` when set and not empty.
    pub api_key: Option<String>,
    /// Bounds connecting and every wait for data; see
    /// [timeouts](OpenAiModel#timeouts). Default 120 s.
    pub timeout: Duration,
    /// Sent as `max_tokens` when set.
    pub max_output_tokens: Option<u32>,
}

impl OpenAiConfig {
    /// The default [`OpenAiConfig::timeout`].
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

    /// A configuration without an API key (enough for most local servers),
    /// with the default timeout and no output limit.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Self::DEFAULT_TIMEOUT,
            max_output_tokens: None,
        }
    }

    /// Like [`OpenAiConfig::new`], with the API key read from the
    /// environment variable `key_var` (surrounding whitespace trimmed). Keys
    /// are taken from the environment, never from arguments, so they stay out
    /// of shell histories and process listings.
    ///
    /// # Errors
    /// A fatal [`ModelError`] naming the variable (never its value) when the
    /// name is not a valid variable name, or the variable is unset, empty or
    /// not valid Unicode.
    pub fn from_env(
        base_url: impl Into<String>,
        model: impl Into<String>,
        key_var: &str,
    ) -> Result<Self, ModelError> {
        if key_var.is_empty() || key_var.contains(['=', '\0']) {
            return Err(ModelError::fatal(format!(
                "invalid environment variable name {key_var:?} for the api key"
            )));
        }
        let key = match std::env::var(key_var) {
            Ok(key) => key,
            Err(std::env::VarError::NotPresent) => {
                return Err(ModelError::fatal(format!(
                    "environment variable {key_var} (the api key) is not set"
                )))
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(ModelError::fatal(format!(
                    "environment variable {key_var} (the api key) is not valid unicode"
                )))
            }
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(ModelError::fatal(format!(
                "environment variable {key_var} (the api key) is empty"
            )));
        }
        Ok(Self::new(base_url, model).with_api_key(key))
    }

    /// Sets the API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the timeout (see [timeouts](OpenAiModel#timeouts)).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Limits the tokens of one answer (`max_tokens`).
    pub fn with_max_output_tokens(mut self, max: u32) -> Self {
        self.max_output_tokens = Some(max);
        self
    }

    fn key(&self) -> Option<&str> {
        self.api_key.as_deref().filter(|k| !k.is_empty())
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| Redacted))
            .field("timeout", &self.timeout)
            .field("max_output_tokens", &self.max_output_tokens)
            .finish()
    }
}

struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

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
/// - The API key is sent as `Authorization: Bearer …`. It never appears in
///   `Debug` output, logs or error messages; a server that echoes it back in
///   an error body has it replaced by `[redacted]`.
/// - Failures are classified through [`ModelError::retryable`]: rate limits
///   (429), request timeouts (408), server errors (5xx), connection failures,
///   dropped connections and timeouts may pass on retry; other 4xx answers
///   and malformed or truncated responses will not.
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
    /// zero, the base URL is not an `http`/`https` URL, the key cannot be
    /// sent in an HTTP header, or the HTTP client cannot be built.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        if config.model.trim().is_empty() {
            return Err(ModelError::fatal("the openai model name is empty"));
        }
        if config.timeout.is_zero() {
            return Err(ModelError::fatal("the openai timeout must be positive"));
        }
        let endpoint = endpoint_url(&config.base_url)?;
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

    fn request_body(&self, request: &ModelRequest<'_>, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), Value::String(self.config.model.clone()));
        body.insert(
            "messages".into(),
            request.messages.iter().map(wire_message).collect(),
        );
        if !request.tools.is_empty() {
            body.insert(
                "tools".into(),
                request.tools.iter().map(wire_tool).collect(),
            );
        }
        if let Some(max) = self.config.max_output_tokens {
            body.insert("max_tokens".into(), json!(max));
        }
        if stream {
            body.insert("stream".into(), Value::Bool(true));
            body.insert("stream_options".into(), json!({ "include_usage": true }));
        }
        Value::Object(body)
    }

    async fn call(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let body = self.request_body(request, request.deltas.is_some());
        let mut builder = self.client.post(self.endpoint.clone()).json(&body);
        if let Some(authorization) = &self.authorization {
            builder = builder.header(AUTHORIZATION, authorization.clone());
        }
        builder = match request.deltas {
            Some(_) => builder.header(ACCEPT, "text/event-stream"),
            None => builder.timeout(self.config.timeout),
        };
        let response = builder
            .send()
            .await
            .map_err(|e| self.transport_error(e, "waiting for the response"))?;
        let status = response.status();
        tracing::debug!(
            status = status.as_u16(),
            "chat completions endpoint answered"
        );
        if !status.is_success() {
            return Err(self.status_error(response).await);
        }
        match request.deltas {
            // A server that ignores `stream` answers with one JSON body: its
            // text becomes a single delta.
            Some(deltas) if is_json(&response) => {
                let answer = self.read_completion(response).await?;
                if !answer.content.is_empty() {
                    deltas(&answer.content);
                }
                Ok(answer)
            }
            Some(deltas) => self.read_stream(response, deltas).await,
            None => self.read_completion(response).await,
        }
    }

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
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport_error(e, "reading the response"))?
        {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ModelError::fatal(format!(
                    "the chat completion response exceeds {} MiB",
                    MAX_BODY_BYTES >> 20
                )));
            }
            body.extend_from_slice(&chunk);
        }
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
        if let Some(error) = &completion.error {
            if !error.is_null() {
                return Err(self.error_object(error, "the chat completion response"));
            }
        }
        let choice = completion
            .choices
            .unwrap_or_default()
            .into_iter()
            .min_by_key(|c| c.index.unwrap_or(0))
            .ok_or_else(|| ModelError::fatal("the chat completion response has no choices"))?;
        let message = choice
            .message
            .ok_or_else(|| ModelError::fatal("the chat completion choice has no message"))?;
        let content = text_content(message.content)?;
        let mut tool_calls = Vec::new();
        for (position, call) in message
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let function = call.function.unwrap_or_default();
            let mut arguments = String::new();
            push_arguments(&mut arguments, function.arguments);
            tool_calls.push(finish_call(
                position,
                call.id.unwrap_or_default(),
                function.name.unwrap_or_default(),
                arguments,
            )?);
        }
        Ok(ModelResponse {
            content,
            tool_calls,
            usage: completion
                .usage
                .map(WireUsage::into_usage)
                .unwrap_or_default(),
        })
    }

    async fn read_stream(
        &self,
        response: reqwest::Response,
        deltas: TextDeltas<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let mut body = std::pin::pin!(response.bytes_stream());
        let mut parser = SseParser::default();
        let mut assembly = StreamAssembly::default();
        let mut events = Vec::new();
        loop {
            let ended = match body.next().await {
                Some(Ok(bytes)) => {
                    parser.push(&bytes, &mut events)?;
                    false
                }
                Some(Err(e)) => {
                    return Err(self.transport_error(e, "reading the event stream"));
                }
                None => {
                    parser.finish(&mut events)?;
                    true
                }
            };
            for data in events.drain(..) {
                if assembly.apply(&data, deltas, self)? {
                    tracing::debug!(events = assembly.events, "event stream done");
                    return assembly.finish();
                }
            }
            if ended {
                return Err(ModelError::fatal(format!(
                    "truncated chat completion stream: it ended after {} events without data: [DONE]",
                    assembly.events
                )));
            }
        }
    }

    /// The error for a non-2xx answer.
    async fn status_error(&self, mut response: reqwest::Response) -> ModelError {
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(|v| format!(" (retry after {})", excerpt(v, 40)))
            .unwrap_or_default();
        let mut body = Vec::new();
        // A body that cannot be read only costs the excerpt.
        while let Ok(Some(chunk)) = response.chunk().await {
            let room = MAX_ERROR_BODY_BYTES.saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() >= MAX_ERROR_BODY_BYTES {
                break;
            }
        }
        let text = String::from_utf8_lossy(&body);
        let detail = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| error_text(&v))
            .unwrap_or_else(|| text.into_owned());
        let detail = excerpt(&self.redact(&detail), EXCERPT_CHARS);
        let mut message = format!("chat completions endpoint answered {status}{retry_after}");
        if !detail.is_empty() {
            message.push_str(": ");
            message.push_str(&detail);
        }
        let retryable = status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::REQUEST_TIMEOUT
            || status.is_server_error();
        ModelError { message, retryable }
    }

    /// The error for an `error` object in a successful answer or a stream.
    fn error_object(&self, error: &Value, place: &str) -> ModelError {
        let detail = error_text(&json!({ "error": error })).unwrap_or_default();
        let message = format!(
            "{place} reported an error: {}",
            excerpt(&self.redact(&detail), EXCERPT_CHARS)
        );
        // Such errors are mostly the server failing mid-answer; only a
        // refusal of the request itself is final.
        let code = error.get("code");
        let client_error = error.get("type").and_then(Value::as_str)
            == Some("invalid_request_error")
            || code
                .and_then(Value::as_u64)
                .is_some_and(|c| (400..500).contains(&c) && c != 408 && c != 429);
        ModelError {
            message,
            retryable: !client_error,
        }
    }

    /// The error for a failure of the HTTP exchange itself.
    fn transport_error(&self, e: reqwest::Error, during: &str) -> ModelError {
        let e = e.without_url();
        if e.is_timeout() {
            return ModelError::retryable(format!(
                "the chat completions endpoint timed out while {during} (timeout {:?})",
                self.config.timeout
            ));
        }
        let detail = self.redact(&chain(&e));
        if e.is_builder() || e.is_redirect() || e.is_decode() {
            ModelError::fatal(format!(
                "chat completion request failed while {during}: {detail}"
            ))
        } else if e.is_connect() {
            ModelError::retryable(format!(
                "cannot connect to the chat completions endpoint: {detail}"
            ))
        } else {
            ModelError::retryable(format!("the connection failed while {during}: {detail}"))
        }
    }

    fn redact(&self, text: &str) -> String {
        match self.config.key() {
            Some(key) => text.replace(key, "[redacted]"),
            None => text.to_owned(),
        }
    }
}

impl fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint.as_str())
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
    /// answers, malformed or truncated responses and tool calls without a
    /// name. Messages carry the status and a short excerpt of the server's
    /// error text, never the API key.
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

/// Whether a response says its body is JSON (rather than an event stream).
fn is_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// `{base_url}/chat/completions`, checked.
fn endpoint_url(base_url: &str) -> Result<reqwest::Url, ModelError> {
    let base = base_url.trim().trim_end_matches('/');
    if base.is_empty() {
        return Err(ModelError::fatal("the openai base url is empty"));
    }
    let url = reqwest::Url::parse(&format!("{base}/chat/completions"))
        .map_err(|e| ModelError::fatal(format!("invalid openai base url: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ModelError::fatal(format!(
            "invalid openai base url: scheme {} is not http or https",
            url.scheme()
        )));
    }
    Ok(url)
}

fn wire_message(message: &Message) -> Value {
    match message {
        Message::System { content } => json!({ "role": "system", "content": content }),
        Message::User { content } => json!({ "role": "user", "content": content }),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            let mut wire = Map::new();
            wire.insert("role".into(), "assistant".into());
            let content = if content.is_empty() && !tool_calls.is_empty() {
                Value::Null
            } else {
                Value::String(content.clone())
            };
            wire.insert("content".into(), content);
            if !tool_calls.is_empty() {
                let calls = tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": { "name": call.name, "arguments": call.arguments },
                        })
                    })
                    .collect();
                wire.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(wire)
        }
        // The protocol has no error flag: the tool's text says what failed.
        Message::Tool {
            call_id, content, ..
        } => json!({ "role": "tool", "tool_call_id": call_id, "content": content }),
    }
}

fn wire_tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    })
}

/// A message's `content`: a string, null, or an array of text parts.
fn text_content(content: Option<Value>) -> Result<String, ModelError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|part| match part {
                Value::String(text) => Some(text.as_str()),
                part => part.get("text").and_then(Value::as_str),
            })
            .collect()),
        Some(other) => Err(ModelError::fatal(format!(
            "malformed chat completion response: message content is {}",
            json_kind(&other)
        ))),
    }
}

/// Appends a tool call's `arguments` (normally a JSON string; some servers
/// send the object itself).
fn push_arguments(arguments: &mut String, fragment: Option<Value>) {
    match fragment {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => arguments.push_str(&text),
        Some(other) => arguments.push_str(&other.to_string()),
    }
}

/// A complete tool call. A call without an id gets a generated one; a call
/// without arguments gets `{}`.
fn finish_call(
    position: usize,
    id: String,
    name: String,
    arguments: String,
) -> Result<ToolCall, ModelError> {
    if name.is_empty() {
        return Err(ModelError::fatal(format!(
            "malformed chat completion response: tool call {position} has no function name"
        )));
    }
    let id = if id.is_empty() {
        format!("call_{}", uuid::Uuid::new_v4().simple())
    } else {
        id
    };
    let arguments = if arguments.trim().is_empty() {
        "{}".to_owned()
    } else {
        arguments
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

/// The human-readable part of an error body: `error.message`, `error` as a
/// string, or `message`.
fn error_text(body: &Value) -> Option<String> {
    let error = body.get("error");
    error
        .and_then(|e| e.get("message"))
        .or_else(|| error.filter(|e| e.is_string()))
        .or_else(|| body.get("message"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| error.map(Value::to_string))
}

/// Describes a decoding error by its category and position and by what was
/// `expected`. Never by serde's own message: it quotes the offending value,
/// which is model output, and errors are logged and stored.
fn decode_error(e: &serde_json::Error, expected: &str) -> String {
    let what = match e.classify() {
        Category::Io => "read error",
        Category::Syntax => "invalid json",
        Category::Data => "invalid type or value",
        Category::Eof => "unexpected end of input",
    };
    format!(
        "{what} at line {} column {} (expected {expected})",
        e.line(),
        e.column()
    )
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most `max` characters of `text`, whitespace collapsed.
fn excerpt(text: &str, max: usize) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

/// An error and its sources, joined by `: `.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    text
}

/// Splits a byte stream into server-sent events and yields their `data`.
#[derive(Default)]
struct SseParser {
    buffer: Vec<u8>,
    /// Bytes at the start of `buffer` known to hold no line end.
    scanned: usize,
    data: Option<String>,
}

impl SseParser {
    fn push(&mut self, bytes: &[u8], events: &mut Vec<String>) -> Result<(), ModelError> {
        self.buffer.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(offset) = self.buffer[start + self.scanned..]
            .iter()
            .position(|&b| b == b'\n')
        {
            let end = start + self.scanned + offset;
            Self::line(&mut self.data, &self.buffer[start..end], events)?;
            start = end + 1;
            self.scanned = 0;
        }
        self.buffer.drain(..start);
        self.scanned = self.buffer.len();
        if self.buffer.len() > MAX_EVENT_BYTES {
            return Err(ModelError::fatal(format!(
                "malformed chat completion stream: a line exceeds {} MiB",
                MAX_EVENT_BYTES >> 20
            )));
        }
        Ok(())
    }

    /// The end of the stream. An event cut off by it is a truncated stream,
    /// except a final `[DONE]` that only lacks its line ends.
    fn finish(&mut self, events: &mut Vec<String>) -> Result<(), ModelError> {
        let rest = std::mem::take(&mut self.buffer);
        self.scanned = 0;
        if !rest.is_empty() {
            Self::line(&mut self.data, &rest, events)?;
        }
        match self.data.take() {
            Some(data) if data.trim() == "[DONE]" => events.push(data),
            Some(_) => {
                return Err(ModelError::fatal(
                    "truncated chat completion stream: it ended in the middle of an event",
                ))
            }
            None => {}
        }
        Ok(())
    }

    /// One line: a `data` field is added to the pending event, an empty line
    /// dispatches it; comments and other fields are ignored.
    fn line(
        pending: &mut Option<String>,
        line: &[u8],
        events: &mut Vec<String>,
    ) -> Result<(), ModelError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if let Some(data) = pending.take() {
                events.push(data);
            }
            return Ok(());
        }
        let line = std::str::from_utf8(line).map_err(|_| {
            ModelError::fatal("malformed chat completion stream: an event is not valid utf-8")
        })?;
        if line.starts_with(':') {
            return Ok(()); // a comment, e.g. a keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field == "data" {
            match pending {
                Some(data) => {
                    if data.len() + value.len() > MAX_EVENT_BYTES {
                        return Err(ModelError::fatal(format!(
                            "malformed chat completion stream: an event exceeds {} MiB",
                            MAX_EVENT_BYTES >> 20
                        )));
                    }
                    data.push('\n');
                    data.push_str(value);
                }
                None => *pending = Some(value.to_owned()),
            }
        }
        Ok(())
    }
}

/// What a stream has said so far.
#[derive(Default)]
struct StreamAssembly {
    content: String,
    calls: BTreeMap<u64, PartialCall>,
    usage: Option<Usage>,
    events: usize,
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

impl StreamAssembly {
    /// Applies one event; true at `[DONE]`.
    fn apply(
        &mut self,
        data: &str,
        deltas: TextDeltas<'_>,
        model: &OpenAiModel,
    ) -> Result<bool, ModelError> {
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        self.events += 1;
        let chunk: StreamChunk = serde_json::from_str(data).map_err(|e| {
            ModelError::fatal(format!(
                "malformed chat completion stream: event {} is not a valid chunk: {}",
                self.events,
                decode_error(&e, "a chat completion chunk object")
            ))
        })?;
        if let Some(error) = &chunk.error {
            if !error.is_null() {
                return Err(model.error_object(error, "the chat completion stream"));
            }
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into_usage());
        }
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                deltas(&text);
                self.content.push_str(&text);
            }
            for (position, fragment) in delta.tool_calls.unwrap_or_default().into_iter().enumerate()
            {
                let index = fragment.index.unwrap_or(position as u64);
                let call = self.calls.entry(index).or_default();
                if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
                    if call.id.is_empty() {
                        call.id = id;
                    }
                }
                let function = fragment.function.unwrap_or_default();
                if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                    if call.name.is_empty() {
                        call.name = name;
                    }
                }
                push_arguments(&mut call.arguments, function.arguments);
            }
        }
        Ok(false)
    }

    fn finish(self) -> Result<ModelResponse, ModelError> {
        let tool_calls = self
            .calls
            .into_values()
            .enumerate()
            .map(|(position, call)| finish_call(position, call.id, call.name, call.arguments))
            .collect::<Result<_, _>>()?;
        Ok(ModelResponse {
            content: self.content,
            tool_calls,
            usage: self.usage.unwrap_or_default(),
        })
    }
}

// The wire format, read leniently: every field may be missing or null.

#[derive(Deserialize, Default)]
#[serde(default)]
struct Completion {
    choices: Option<Vec<Choice>>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Choice {
    index: Option<u64>,
    message: Option<WireMessage>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireMessage {
    content: Option<Value>,
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireToolCall {
    index: Option<u64>,
    id: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireFunction {
    name: Option<String>,
    arguments: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PromptTokensDetails {
    cached_tokens: Option<u64>,
}

impl WireUsage {
    fn into_usage(self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens.unwrap_or(0),
            output_tokens: self.completion_tokens.unwrap_or(0),
            cache_read_tokens: self
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamChunk {
    choices: Option<Vec<StreamChoice>>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamChoice {
    index: Option<u64>,
    delta: Option<StreamDelta>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamDelta {
    content: Option<String>,
    tool_calls: Option<Vec<WireToolCall>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<String> {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for chunk in chunks {
            parser.push(chunk, &mut events).unwrap();
        }
        parser.finish(&mut events).unwrap();
        events
    }

    #[test]
    fn sse_events_are_split_across_chunk_boundaries() {
        let events = parse(&[
            b"data: {\"a\"",
            b":1}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n",
            b"\ndata: [DO",
            b"NE]\n\n",
        ]);
        assert_eq!(events, ["{\"a\":1}", "x\ny", "[DONE]"]);
    }

    #[test]
    fn a_stream_may_end_right_after_done() {
        assert_eq!(parse(&[b"data: x\n\ndata: [DONE]"]), ["x", "[DONE]"]);
        assert_eq!(parse(&[b"data: [DONE]\n"]), ["[DONE]"]);
    }

    #[test]
    fn an_event_cut_off_by_the_end_of_the_stream_is_truncated() {
        for tail in [&b"data: {\"cho"[..], b"data: {}\n"] {
            let mut parser = SseParser::default();
            let mut events = Vec::new();
            parser.push(tail, &mut events).unwrap();
            let error = parser.finish(&mut events).unwrap_err();
            assert!(error.message.contains("truncated"), "{error}");
        }
    }

    #[test]
    fn malformed_chunks_are_not_quoted_into_errors() {
        const MARK: &str = "MALFORMED-CHUNK-MARK";
        let model = OpenAiModel::new(OpenAiConfig::new("http://127.0.0.1:9/v1", "m")).unwrap();
        let chunks = [
            json!({ "choices": [{ "delta": format!("private {MARK}") }] }).to_string(),
            json!({ "choices": [{ "delta": { "content": ["a", MARK] } }] }).to_string(),
            json!({ "choices": [{ "index": MARK }] }).to_string(),
            json!({ "usage": { "prompt_tokens": -1 } }).to_string(),
            format!("{{\"choices\": {MARK}"),
            format!("{{\"choices\": \"{MARK}"),
        ];
        for chunk in chunks {
            let error = StreamAssembly::default()
                .apply(&chunk, &|_| {}, &model)
                .unwrap_err();
            assert!(!error.message.contains(MARK), "{error}");
            assert!(error.message.contains("malformed"), "{error}");
            assert!(error.message.contains(" at line 1 column "), "{error}");
        }
        let serde = serde_json::from_str::<Completion>(
            &json!({ "choices": [{ "message": format!("private {MARK}") }] }).to_string(),
        )
        .map(|_| ())
        .unwrap_err();
        let detail = decode_error(&serde, "a chat completion object");
        assert!(
            detail.starts_with("invalid type or value at line 1 column "),
            "{detail}"
        );
        assert!(!detail.contains(MARK), "{detail}");
    }

    #[test]
    fn excerpts_cut_on_char_boundaries() {
        assert_eq!(excerpt("  é\n\té  é ", 3), "é é…");
        assert_eq!(excerpt("short", 10), "short");
    }

    #[test]
    fn endpoint_urls_are_checked() {
        assert_eq!(
            endpoint_url("http://127.0.0.1:8080/v1/").unwrap().as_str(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
        assert!(endpoint_url("").is_err());
        assert!(endpoint_url("ftp://example.com").is_err());
        assert!(endpoint_url("not a url").is_err());
    }
}
