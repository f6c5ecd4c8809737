//! [`OpenAiConfig`]: where and how to reach the endpoint, and keeping its
//! API key out of `Debug` output and error messages.

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};
use turnstile_core::ModelError;
use turnstile_model_http::{api_key_from_env, redact, redacted_url, Redacted, RetryPolicy};

/// Where and how to reach an OpenAI-compatible endpoint.
///
/// Build it with [`OpenAiConfig::new`] or [`OpenAiConfig::from_env`] and the
/// `with_*` methods. `Debug` prints the key as `<redacted>` and of
/// [`OpenAiConfig::extra_body`] only the member names.
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
    /// [timeouts](crate::OpenAiModel#timeouts). Default 120 s.
    pub timeout: Duration,
    /// Sent as `max_tokens` when set.
    pub max_output_tokens: Option<u32>,
    /// Further members of every request body, sent as they are: sampling
    /// parameters (`temperature`, `seed`), `tool_choice`, `logit_bias`, or a
    /// server's own extensions. See [`OpenAiConfig::with_extra_body`].
    pub extra_body: Map<String, Value>,
    /// Which of the model's earlier reasoning is sent back. Default
    /// [`ReasoningReplay::Never`].
    pub reasoning_replay: ReasoningReplay,
    /// How a rate-limited (429), timed-out (408) or failing (5xx) call, or
    /// one whose answer broke off before any of its text was shown, is sent
    /// again. Default [`RetryPolicy::default`]: 4 retries, waits up to 60 s.
    pub retry: RetryPolicy,
}

/// Which assistant messages' reasoning (`reasoning_content`, as reasoning
/// models behind OpenAI-compatible servers return it: vLLM, llama.cpp with
/// `--reasoning-format`, DeepSeek) is sent back with them. Only reasoning
/// this client read (provider `openai`) and that is in the context is
/// sent; another provider's is not this server's to read.
///
/// None by default: some servers refuse an assistant message that carries
/// `reasoning_content` (Groq, Cerebras), and a refusal would stop every
/// tool loop; servers that need it back within a tool loop (DeepSeek's
/// thinking mode with tools) take [`ReasoningReplay::CurrentToolCycle`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningReplay {
    /// The answers after the last user message: the tool loop in progress.
    CurrentToolCycle,
    /// Every answer's in the context. Committed requests' reasoning is in
    /// it only with `PastReasoning::Sent` (the session's context policy).
    Always,
    /// None.
    #[default]
    Never,
}

impl OpenAiConfig {
    /// The request-body members the model sets itself, which
    /// [`OpenAiConfig::extra_body`] may not name.
    pub const RESERVED_BODY_MEMBERS: [&'static str; 6] = [
        "model",
        "messages",
        "tools",
        "max_tokens",
        "stream",
        "stream_options",
    ];

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
            extra_body: Map::new(),
            reasoning_replay: ReasoningReplay::default(),
            retry: RetryPolicy::default(),
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
        let key = api_key_from_env(key_var)?;
        Ok(Self::new(base_url, model).with_api_key(key))
    }

    /// Sets the API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the timeout (see [timeouts](crate::OpenAiModel#timeouts)).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Limits the tokens of one answer (`max_tokens`).
    pub fn with_max_output_tokens(mut self, max: u32) -> Self {
        self.max_output_tokens = Some(max);
        self
    }

    /// Adds members to every request body (a member already added is
    /// replaced), e.g. `{"temperature": 0, "tool_choice": "required"}`.
    /// They are sent unchecked, so a server may refuse them; the answer is
    /// read the usual way whatever they ask for (with `n` above 1, the first
    /// choice is the answer). `tool_choice` and `parallel_tool_calls` are
    /// left out of a request without tools, which servers refuse.
    ///
    /// The members the model sets itself
    /// ([`RESERVED_BODY_MEMBERS`](Self::RESERVED_BODY_MEMBERS)) cannot be
    /// replaced: [`OpenAiModel::new`](crate::OpenAiModel::new) refuses a
    /// configuration that names one. `max_tokens` is set with
    /// [`OpenAiConfig::with_max_output_tokens`].
    pub fn with_extra_body(mut self, members: Map<String, Value>) -> Self {
        self.extra_body.extend(members);
        self
    }

    /// Sets how failed calls are sent again ([`RetryPolicy::NEVER`]: never).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets which earlier reasoning is sent back.
    pub fn with_reasoning_replay(mut self, replay: ReasoningReplay) -> Self {
        self.reasoning_replay = replay;
        self
    }

    /// The key, when set and not empty.
    pub(crate) fn key(&self) -> Option<&str> {
        self.api_key.as_deref().filter(|k| !k.is_empty())
    }

    /// `text` with every occurrence of the key replaced by `[redacted]`.
    pub(crate) fn redact(&self, text: &str) -> String {
        redact(self.key(), text)
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &redacted_url(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| Redacted))
            .field("timeout", &self.timeout)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("extra_body", &self.extra_body.keys().collect::<Vec<_>>())
            .field("reasoning_replay", &self.reasoning_replay)
            .field("retry", &self.retry)
            .finish()
    }
}
