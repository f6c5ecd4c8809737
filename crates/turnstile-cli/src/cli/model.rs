//! `--model scripted:FILE` (a JSON script of replies), `--model
//! openai:NAME` (an OpenAI-compatible endpoint) or `--model anthropic:NAME`
//! (the Anthropic Messages API); keys from the environment.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use clap::Args;
use serde_json::Value;

use super::exit::CliError;
use turnstile::agent::{Model, ScriptedModel, ScriptedReply};

/// The endpoint used by `openai:NAME` without `--base-url`.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The variable the API key is read from without `--api-key-env` (when set).
pub const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";
/// The same, for `anthropic:NAME`.
pub const ANTHROPIC_KEY_ENV: &str = "ANTHROPIC_API_KEY";
/// Tokens an answer has beyond its thinking budget (`max_tokens` is the
/// budget plus this; without thinking it is the client's default).
const ANSWER_TOKENS: u32 = 8192;

/// Which model answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    /// A JSON file holding an array of scripted replies.
    Scripted(PathBuf),
    /// A model name on an OpenAI-compatible endpoint.
    OpenAi(String),
    /// A model name on the Anthropic Messages API.
    Anthropic(String),
}

impl ModelSpec {
    /// The spec as typed: `openai:NAME`.
    pub fn to_arg(&self) -> String {
        match self {
            ModelSpec::Scripted(path) => format!("scripted:{}", path.display()),
            ModelSpec::OpenAi(name) => format!("openai:{name}"),
            ModelSpec::Anthropic(name) => format!("anthropic:{name}"),
        }
    }
}

impl FromStr for ModelSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("scripted", file)) if !file.is_empty() => Ok(Self::Scripted(file.into())),
            Some(("openai", name)) if !name.trim().is_empty() => Ok(Self::OpenAi(name.into())),
            Some(("anthropic", name)) if !name.trim().is_empty() => {
                Ok(Self::Anthropic(name.into()))
            }
            _ => Err("expected scripted:FILE, openai:MODEL_NAME or anthropic:MODEL_NAME".into()),
        }
    }
}

/// The model options shared by `run`, `resume` and `recover`.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// The model: `scripted:FILE` (a JSON array of replies: text,
    /// tool_calls, usage, delay_ms, failure, fail_times), `openai:NAME` (an
    /// OpenAI-compatible endpoint) or `anthropic:NAME` (the Anthropic
    /// Messages API).
    #[arg(long, value_name = "scripted:FILE|openai:NAME|anthropic:NAME")]
    pub model: ModelSpec,
    /// The API root: an OpenAI-compatible one (default
    /// https://api.openai.com/v1) or Anthropic's (default
    /// https://api.anthropic.com).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The environment variable holding the API key. Without it,
    /// OPENAI_API_KEY (openai) or ANTHROPIC_API_KEY (anthropic) is used
    /// when set. The key itself is never taken from an argument.
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// Extended thinking with this many tokens of budget (anthropic models
    /// only; Anthropic's API takes at least 1024). The answer may hold 8192
    /// tokens beyond it (`max_tokens` is the sum, which must be within the
    /// model's output limit).
    #[arg(long, value_name = "TOKENS")]
    pub thinking_budget: Option<u32>,
    /// Which of the model's earlier reasoning (`reasoning_content`) is sent
    /// back (openai models only): never (default; some servers refuse it),
    /// the tool loop in progress's (tool-cycle, for servers that need it),
    /// or always (every answer's the context holds: the current
    /// request's).
    #[arg(long, value_name = "WHICH")]
    pub reasoning_replay: Option<ReplayArg>,
}

/// `--reasoning-replay`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayArg {
    /// The answers after the last user message.
    ToolCycle,
    /// Every answer's.
    Always,
    /// None.
    Never,
}

impl ReplayArg {
    /// The flag's value, as typed.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayArg::ToolCycle => "tool-cycle",
            ReplayArg::Always => "always",
            ReplayArg::Never => "never",
        }
    }
}

impl From<ReplayArg> for turnstile::ReasoningReplay {
    fn from(arg: ReplayArg) -> Self {
        match arg {
            ReplayArg::ToolCycle => turnstile::ReasoningReplay::CurrentToolCycle,
            ReplayArg::Always => turnstile::ReasoningReplay::Always,
            ReplayArg::Never => turnstile::ReasoningReplay::Never,
        }
    }
}

/// Builds the model. Everything is read and checked here, before any
/// database is opened, so a bad script writes nothing.
pub fn load(args: &ModelArgs) -> Result<Arc<dyn Model>, CliError> {
    match &args.model {
        ModelSpec::Scripted(path) => {
            if args.base_url.is_some()
                || args.api_key_env.is_some()
                || args.reasoning_replay.is_some()
                || args.thinking_budget.is_some()
            {
                return Err(CliError::Usage(
                    "--base-url, --api-key-env, --reasoning-replay and --thinking-budget apply \
                     to openai and anthropic models only"
                        .into(),
                ));
            }
            Ok(Arc::new(ScriptedModel::new(load_script(path)?)))
        }
        ModelSpec::OpenAi(_) if args.thinking_budget.is_some() => Err(CliError::Usage(
            "--thinking-budget applies to anthropic models only; an openai model's reasoning \
             is set by the server or with its own parameters"
                .into(),
        )),
        ModelSpec::OpenAi(name) => openai(name, args),
        ModelSpec::Anthropic(_) if args.reasoning_replay.is_some() => Err(CliError::Usage(
            "--reasoning-replay applies to openai models only; an anthropic model's thinking \
             always goes back with the answer that produced it"
                .into(),
        )),
        ModelSpec::Anthropic(name) => anthropic(name, args),
    }
}

/// Reads a script: a JSON array of [`ScriptedReply`]. For convenience,
/// `usage` may omit token kinds (they count 0) and a tool call's
/// `arguments` may be a JSON object instead of a string.
pub fn load_script(path: &Path) -> Result<Vec<ScriptedReply>, CliError> {
    let unreadable = |e: std::io::Error| {
        CliError::Usage(format!("cannot read script file {}: {e}", path.display()))
    };
    // Bounded: `scripted:/dev/zero` must not read without end.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_SCRIPT_BYTES + 1).read_to_string(&mut text))
        .map_err(unreadable)?;
    let bad = |why: String| {
        CliError::Usage(format!(
            "script file {} is not a JSON array of replies: {why}",
            path.display()
        ))
    };
    if text.len() as u64 > MAX_SCRIPT_BYTES {
        return Err(bad(format!("it is over the {MAX_SCRIPT_BYTES}-byte limit")));
    }
    let mut value: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let replies = value
        .as_array_mut()
        .ok_or_else(|| bad("the top level is not an array".into()))?;
    if replies.is_empty() {
        return Err(bad("it holds no reply".into()));
    }
    for (i, reply) in replies.iter_mut().enumerate() {
        refuse_unknown_fields(reply).map_err(bad)?;
        // Without a count the failure would never happen: say so rather
        // than run a script that does not do what it reads as.
        let fails = reply.get("fail_times").and_then(Value::as_u64).unwrap_or(0);
        if reply.get("failure").is_some() && fails == 0 {
            return Err(bad(format!(
                "reply {} has a \"failure\" but no \"fail_times\": say how many calls \
                 fail (\"fail_times\": 1)",
                i + 1
            )));
        }
        normalize(reply);
    }
    serde_json::from_value(value).map_err(|e| bad(e.to_string()))
}

/// The largest script file read.
const MAX_SCRIPT_BYTES: u64 = 16 << 20;

/// A tool call's and a usage's fields, checked here because their types are
/// also read from stored transcripts, where they stay lenient.
fn refuse_unknown_fields(reply: &Value) -> Result<(), String> {
    let check = |what: &str, object: &Value, known: &[&str]| match object.as_object() {
        Some(fields) => match fields.keys().find(|k| !known.contains(&k.as_str())) {
            Some(unknown) => Err(format!("unknown field `{unknown}` in {what}")),
            None => Ok(()),
        },
        None => Ok(()),
    };
    if let Some(usage) = reply.get("usage") {
        check(
            "a usage",
            usage,
            &[
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_write_tokens",
            ],
        )?;
    }
    if let Some(calls) = reply.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            check("a tool call", call, &["id", "name", "arguments"])?;
        }
    }
    Ok(())
}

fn normalize(reply: &mut Value) {
    if let Some(usage) = reply.get_mut("usage").and_then(Value::as_object_mut) {
        for kind in [
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
        ] {
            usage.entry(kind).or_insert(Value::from(0));
        }
    }
    if let Some(calls) = reply.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            if let Some(arguments) = call.get_mut("arguments") {
                if !arguments.is_string() {
                    *arguments = Value::String(arguments.to_string());
                }
            }
        }
    }
}

fn openai(name: &str, args: &ModelArgs) -> Result<Arc<dyn Model>, CliError> {
    use turnstile::{OpenAiConfig, OpenAiModel};

    let base_url = args.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL);
    let config = match args.api_key_env.as_deref() {
        Some(var) => OpenAiConfig::from_env(base_url, name, var),
        // Local servers need no key: the default variable is optional.
        None if std::env::var_os(DEFAULT_KEY_ENV).is_some() => {
            OpenAiConfig::from_env(base_url, name, DEFAULT_KEY_ENV)
        }
        None => Ok(OpenAiConfig::new(base_url, name)),
    }
    .map_err(|e| CliError::Usage(e.message))?;
    let config = match args.reasoning_replay {
        Some(replay) => config.with_reasoning_replay(replay.into()),
        None => config,
    };
    let model = OpenAiModel::new(config).map_err(|e| CliError::Usage(e.message))?;
    Ok(Arc::new(model))
}

fn anthropic(name: &str, args: &ModelArgs) -> Result<Arc<dyn Model>, CliError> {
    use turnstile::{AnthropicConfig, AnthropicModel};

    let config = match args.api_key_env.as_deref() {
        Some(var) => AnthropicConfig::from_env(name, var),
        // A local server that speaks the protocol needs no key.
        None if std::env::var_os(ANTHROPIC_KEY_ENV).is_some() => {
            AnthropicConfig::from_env(name, ANTHROPIC_KEY_ENV)
        }
        None => Ok(AnthropicConfig::new(name)),
    }
    .map_err(|e| CliError::Usage(e.message))?;
    let config = match &args.base_url {
        Some(url) => config.with_base_url(url),
        None => config,
    };
    let config = match args.thinking_budget {
        Some(budget) => config
            .with_thinking_budget(budget)
            .with_max_tokens(budget.saturating_add(ANSWER_TOKENS)),
        None => config,
    };
    let model = AnthropicModel::new(config).map_err(|e| CliError::Usage(e.message))?;
    Ok(Arc::new(model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_specs_parse() {
        assert_eq!(
            "scripted:a.json".parse::<ModelSpec>(),
            Ok(ModelSpec::Scripted("a.json".into()))
        );
        assert_eq!(
            "openai:gpt-4o-mini".parse::<ModelSpec>(),
            Ok(ModelSpec::OpenAi("gpt-4o-mini".into()))
        );
        assert_eq!(
            "anthropic:claude-sonnet-4-5".parse::<ModelSpec>(),
            Ok(ModelSpec::Anthropic("claude-sonnet-4-5".into()))
        );
        assert!("anthropic:".parse::<ModelSpec>().is_err());
        assert!("scripted:".parse::<ModelSpec>().is_err());
        assert!("claude".parse::<ModelSpec>().is_err());
    }

    #[test]
    fn scripts_accept_partial_usage_and_object_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        std::fs::write(
            &path,
            r#"[{"tool_calls":[{"id":"c1","name":"add","arguments":{"a":1,"b":2}}],
                 "usage":{"input_tokens":10}},
                {"text":"3","delay_ms":5}]"#,
        )
        .unwrap();
        let replies = load_script(&path).unwrap();
        assert_eq!(replies[0].tool_calls[0].arguments, r#"{"a":1,"b":2}"#);
        assert_eq!(replies[0].usage.input_tokens, 10);
        assert_eq!(replies[1].text, "3");

        std::fs::write(&path, "{}").unwrap();
        assert!(matches!(load_script(&path), Err(CliError::Usage(_))));
        std::fs::write(&path, "[]").unwrap();
        assert!(matches!(load_script(&path), Err(CliError::Usage(_))));
        assert!(matches!(
            load_script(&dir.path().join("missing.json")),
            Err(CliError::Usage(_))
        ));
    }
}
