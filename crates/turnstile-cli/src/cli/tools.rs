//! The small real tools of the command-line agent and the demo: `add`,
//! `clock` and `word_count`. They do real work (no canned answers) but have
//! no external effects, so running one again is always safe.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde_json::{json, Value};

use turnstile::agent::{Tool, ToolContext, ToolError};
use turnstile::message::ToolSpec;

/// Every tool of the command-line agent, in a fixed order (the order is
/// part of the agent fingerprint a resumed request is checked against).
pub fn toolbox() -> Vec<Arc<dyn Tool>> {
    vec![Arc::new(Add), Arc::new(Clock), Arc::new(WordCount)]
}

/// Adds two numbers.
pub struct Add;

#[async_trait]
impl Tool for Add {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "add".into(),
            description: "Adds two numbers and returns the sum.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "a": { "type": "number" },
                    "b": { "type": "number" }
                },
                "required": ["a", "b"]
            }),
        }
    }

    async fn call(&self, args: Value, _: ToolContext) -> Result<turnstile::Content, ToolError> {
        add(&args["a"], &args["b"]).map(turnstile::Content::from)
    }
}

fn add(a: &Value, b: &Value) -> Result<String, ToolError> {
    // Integers stay exact; anything else is added as f64.
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        if let Some(sum) = x.checked_add(y) {
            return Ok(sum.to_string());
        }
    }
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if (x + y).is_finite() => Ok((x + y).to_string()),
        (Some(_), Some(_)) => Err(ToolError::new("the sum is not a finite number")),
        _ => Err(ToolError::new("a and b must be numbers")),
    }
}

/// Reads the current UTC time.
pub struct Clock;

#[async_trait]
impl Tool for Clock {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "clock".into(),
            description: "Returns the current UTC time in RFC 3339 format.".into(),
            parameters: json!({ "type": "object", "properties": {} }),
        }
    }

    async fn call(&self, _: Value, _: ToolContext) -> Result<turnstile::Content, ToolError> {
        let now = SystemTime::now();
        // RFC 3339 dates run from 1970 (as Unix time) to 9999.
        let last = UNIX_EPOCH + std::time::Duration::from_secs(253_402_300_799);
        if now < UNIX_EPOCH || now > last {
            return Err(ToolError::new("the system clock is outside 1970-9999"));
        }
        Ok(turnstile::Content::from(
            humantime::format_rfc3339_seconds(now).to_string(),
        ))
    }
}

/// Counts the whitespace-separated words of a text.
pub struct WordCount;

#[async_trait]
impl Tool for WordCount {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "word_count".into(),
            description: "Counts the words (separated by whitespace) of a text.".into(),
            parameters: json!({
                "type": "object",
                "properties": { "text": { "type": "string" } },
                "required": ["text"]
            }),
        }
    }

    async fn call(&self, args: Value, _: ToolContext) -> Result<turnstile::Content, ToolError> {
        let text = args["text"]
            .as_str()
            .ok_or_else(|| ToolError::new("text must be a string"))?;
        Ok(turnstile::Content::from(
            text.split_whitespace().count().to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile::ids::{RequestId, RunId};

    fn ctx() -> ToolContext {
        ToolContext {
            run_id: RunId::new(),
            request_id: RequestId::new(),
            turn: 1,
            call_id: "c".into(),
            idempotency_key: "k".into(),
        }
    }

    #[tokio::test]
    async fn add_is_exact_on_integers_and_refuses_non_numbers() {
        let sum = Add.call(json!({"a": 17, "b": 25}), ctx()).await;
        assert_eq!(sum.unwrap(), "42");
        let sum = Add.call(json!({"a": 0.5, "b": 2}), ctx()).await;
        assert_eq!(sum.unwrap(), "2.5");
        assert!(Add.call(json!({"a": "x", "b": 2}), ctx()).await.is_err());
        let big = Add.call(json!({"a": i64::MAX, "b": 1}), ctx()).await;
        // Past i64, the sum is a float rather than an overflow.
        let big: f64 = big.unwrap().text().parse().unwrap();
        assert_eq!(big, 9_223_372_036_854_775_808.0);
    }

    #[tokio::test]
    async fn word_count_counts_whitespace_separated_words() {
        let n = WordCount
            .call(json!({"text": " the quick\tbrown\nfox "}), ctx())
            .await;
        assert_eq!(n.unwrap(), "4");
        assert!(WordCount.call(json!({}), ctx()).await.is_err());
    }

    #[tokio::test]
    async fn clock_reads_a_current_time() {
        let now = Clock
            .call(json!({}), ctx())
            .await
            .unwrap()
            .text()
            .into_owned();
        assert!(now.starts_with("20") && now.ends_with('Z'), "{now}");
    }
}
