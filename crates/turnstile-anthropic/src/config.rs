//! [`AnthropicConfig`]: where and how to reach the Messages API, what to ask
//! for (thinking, caching), how to retry, and keeping the key out of
//! `Debug` output and error messages.

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};
use turnstile_core::ModelError;
use turnstile_model_http::{api_key_from_env, redact, redacted_url, Redacted, RetryPolicy};

/// Where and how to reach the Anthropic Messages API.
///
/// Build it with [`AnthropicConfig::new`] or [`AnthropicConfig::from_env`]
/// and the `with_*` methods. `Debug` prints the key as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct AnthropicConfig {
    /// The API root, `https://api.anthropic.com` by default;
    /// `/v1/messages` is appended.
    pub base_url: String,
    /// The model, e.g. `claude-sonnet-4-5`.
    pub model: String,
    /// Sent as `x-api-key` when set and not empty.
    pub api_key: Option<String>,
    /// Sent as `anthropic-version`. Default `2023-06-01`.
    pub api_version: String,
    /// Sent as `anthropic-beta` (comma-separated) when not empty, e.g.
    /// `interleaved-thinking-2025-05-14`.
    pub betas: Vec<String>,
    /// `max_tokens`: the most one answer may hold, thinking included. The
    /// API requires it. Default 8,192.
    pub max_tokens: u32,
    /// Extended thinking with this `budget_tokens`, below `max_tokens` (the
    /// API takes at least 1,024; servers that imitate it may take less);
    /// `None`, the default, asks for none.
    pub thinking_budget: Option<u32>,
    /// Where `cache_control` breakpoints go.
    pub prompt_cache: PromptCache,
    /// Whether calls are streamed (the default, and the API's advice for
    /// answers that may take minutes); without, a call is one JSON
    /// exchange that must complete within the timeout.
    pub stream: bool,
    /// Bounds connecting and every wait for data (a non-streamed answer
    /// must also complete within it). Default 600 s: a long answer with
    /// thinking takes minutes.
    pub timeout: Duration,
    /// How rate limits and overloads are retried.
    pub retry: RetryPolicy,
    /// Further members of every request body, sent as they are
    /// (`temperature`, `tool_choice`, `metadata`, `stop_sequences`).
    pub extra_body: Map<String, Value>,
}

/// Where prompt-cache breakpoints (`cache_control: {"type": "ephemeral"}`)
/// go. All three by default: the prefix they end is cached by the first
/// call and read by the next ones, which the provider bills at a tenth of
/// its input price.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptCache {
    /// On the system prompt's last block.
    pub system: bool,
    /// On the last tool.
    pub tools: bool,
    /// On the last block of the last message: the whole conversation so
    /// far, which the next turn sends again.
    pub latest_turn: bool,
}

impl PromptCache {
    /// No breakpoints.
    pub const OFF: PromptCache = PromptCache {
        system: false,
        tools: false,
        latest_turn: false,
    };
}

impl Default for PromptCache {
    fn default() -> Self {
        Self {
            system: true,
            tools: true,
            latest_turn: true,
        }
    }
}

impl AnthropicConfig {
    /// The default [`AnthropicConfig::base_url`].
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";
    /// The default [`AnthropicConfig::api_version`].
    pub const DEFAULT_API_VERSION: &'static str = "2023-06-01";
    /// The environment variable [`AnthropicConfig::from_env`] reads the key
    /// from by default.
    pub const DEFAULT_KEY_VAR: &'static str = "ANTHROPIC_API_KEY";
    /// The default [`AnthropicConfig::max_tokens`].
    pub const DEFAULT_MAX_TOKENS: u32 = 8192;
    /// The request-body members the model sets itself, which
    /// [`AnthropicConfig::extra_body`] may not name.
    pub const RESERVED_BODY_MEMBERS: [&'static str; 7] = [
        "model",
        "messages",
        "system",
        "tools",
        "max_tokens",
        "stream",
        "thinking",
    ];

    /// A configuration for `model` at the default base URL, without a key.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            base_url: Self::DEFAULT_BASE_URL.into(),
            model: model.into(),
            api_key: None,
            api_version: Self::DEFAULT_API_VERSION.into(),
            betas: Vec::new(),
            max_tokens: Self::DEFAULT_MAX_TOKENS,
            thinking_budget: None,
            prompt_cache: PromptCache::default(),
            stream: true,
            timeout: Duration::from_secs(600),
            retry: RetryPolicy::default(),
            extra_body: Map::new(),
        }
    }

    /// Like [`AnthropicConfig::new`], with the API key read from the
    /// environment variable `key_var` (usually
    /// [`DEFAULT_KEY_VAR`](Self::DEFAULT_KEY_VAR)).
    ///
    /// # Errors
    /// A fatal [`ModelError`] naming the variable (never its value) when it
    /// is unset, empty, not Unicode or not a valid name.
    pub fn from_env(model: impl Into<String>, key_var: &str) -> Result<Self, ModelError> {
        Ok(Self::new(model).with_api_key(api_key_from_env(key_var)?))
    }

    /// Sets the API root (`/v1/messages` is appended).
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// Sets the API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Adds a beta feature to `anthropic-beta`.
    pub fn with_beta(mut self, beta: impl Into<String>) -> Self {
        self.betas.push(beta.into());
        self
    }

    /// Sets `max_tokens`.
    pub fn with_max_tokens(mut self, max: u32) -> Self {
        self.max_tokens = max;
        self
    }

    /// Asks for extended thinking with this budget.
    pub fn with_thinking_budget(mut self, budget_tokens: u32) -> Self {
        self.thinking_budget = Some(budget_tokens);
        self
    }

    /// Sets where prompt-cache breakpoints go.
    pub fn with_prompt_cache(mut self, cache: PromptCache) -> Self {
        self.prompt_cache = cache;
        self
    }

    /// Sets whether calls are streamed.
    pub fn with_streaming(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Sets the timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets how rate limits and overloads are retried.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Adds members to every request body (a member already added is
    /// replaced). [`RESERVED_BODY_MEMBERS`](Self::RESERVED_BODY_MEMBERS)
    /// are refused by [`AnthropicModel::new`](crate::AnthropicModel::new).
    pub fn with_extra_body(mut self, members: Map<String, Value>) -> Self {
        self.extra_body.extend(members);
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

    /// Refuses what the API would refuse on every call.
    pub(crate) fn check(&self) -> Result<(), ModelError> {
        if self.model.trim().is_empty() {
            return Err(ModelError::fatal("the anthropic model name is empty"));
        }
        if self.timeout.is_zero() {
            return Err(ModelError::fatal("the anthropic timeout must be positive"));
        }
        if self.max_tokens == 0 {
            return Err(ModelError::fatal(
                "the anthropic max_tokens must be positive",
            ));
        }
        if let Some(budget) = self.thinking_budget {
            if budget >= self.max_tokens {
                return Err(ModelError::fatal(format!(
                    "the thinking budget {budget} must be below max_tokens ({}); raise max_tokens \
                     or lower the budget",
                    self.max_tokens
                )));
            }
        }
        if let Some(name) = Self::RESERVED_BODY_MEMBERS
            .into_iter()
            .find(|name| self.extra_body.contains_key(*name))
        {
            return Err(ModelError::fatal(format!(
                "the extra request body member {name:?} is set by the anthropic model itself"
            )));
        }
        Ok(())
    }
}

impl fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("base_url", &redacted_url(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| Redacted))
            .field("api_version", &self.api_version)
            .field("betas", &self.betas)
            .field("max_tokens", &self.max_tokens)
            .field("thinking_budget", &self.thinking_budget)
            .field("prompt_cache", &self.prompt_cache)
            .field("stream", &self.stream)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("extra_body", &self.extra_body.keys().collect::<Vec<_>>())
            .finish()
    }
}
