// A binary of its own: it sets an environment variable, unsound while other threads read the environment.
//! `OpenAiConfig::from_env`, and what the configuration shows of its
//! secrets.

use turnstile::Model;
use turnstile_openai::{OpenAiConfig, OpenAiModel};

#[test]
fn from_env_reads_the_key_from_the_named_variable_and_never_shows_it() {
    const VAR: &str = "TURNSTILE_TEST_OPENAI_KEY";
    const KEY: &str = "sk-from-env-9f8e7d6c5b4a";

    // Unset, empty and malformed names are refused, naming the variable.
    let error = OpenAiConfig::from_env("http://127.0.0.1:1/v1", "m", VAR).unwrap_err();
    assert!(!error.retryable);
    assert!(error.message.contains(VAR), "{}", error.message);
    assert!(error.message.contains("not set"), "{}", error.message);
    std::env::set_var(VAR, "  \n");
    let error = OpenAiConfig::from_env("http://127.0.0.1:1/v1", "m", VAR).unwrap_err();
    assert!(error.message.contains("empty"), "{}", error.message);
    assert!(OpenAiConfig::from_env("http://127.0.0.1:1/v1", "m", "").is_err());
    assert!(OpenAiConfig::from_env("http://127.0.0.1:1/v1", "m", "A=B").is_err());

    // Surrounding whitespace (a trailing newline from a file) is trimmed.
    std::env::set_var(VAR, format!("{KEY}\n"));
    let config = OpenAiConfig::from_env("http://127.0.0.1:1/v1", "gpt-test", VAR).unwrap();
    std::env::remove_var(VAR);
    assert_eq!(config.api_key.as_deref(), Some(KEY));
    assert_eq!(config.base_url, "http://127.0.0.1:1/v1");
    assert_eq!(config.model, "gpt-test");
    assert_eq!(config.timeout, OpenAiConfig::DEFAULT_TIMEOUT);
    assert_eq!(config.max_output_tokens, None);

    let debug = format!("{config:?} {config:#?}");
    assert!(!debug.contains(KEY), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");

    let model = OpenAiModel::new(config).unwrap();
    assert_eq!(model.name(), "openai:gpt-test");
    let debug = format!("{model:?} {model:#?}");
    assert!(!debug.contains(KEY), "{debug}");
}

#[test]
fn a_password_in_the_base_url_stays_out_of_debug_output() {
    let config = OpenAiConfig::new("https://user:hunter2@llm.internal/v1", "m");
    let model = OpenAiModel::new(config.clone()).expect("valid config");
    for shown in [format!("{config:?}"), format!("{model:?}")] {
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("user:REDACTED@llm.internal"), "{shown}");
    }
}
