//! A deterministic model for tests, demos and harnesses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::model::{Model, ModelRequest, ModelResponse};
use crate::error::ModelError;
use crate::message::{
    Attachment, Content, Message, Part, ProviderMetadata, Reasoning, ToolCall, Usage,
};

/// One scripted answer. Unknown fields are refused when it is read from
/// JSON: a misspelt `delay_ms` must not be ignored silently.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedReply {
    /// Reasoning the answer carries before its text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
    #[serde(default)]
    /// The answer's text.
    pub text: String,
    #[serde(default)]
    /// The tool calls the answer asks for.
    pub tool_calls: Vec<ToolCall>,
    /// What the answer carries for its provider, to be sent back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_metadata: Option<ProviderMetadata>,
    /// Images the answer carries, after its reasoning (not in a script
    /// file: their bytes are not JSON).
    #[serde(skip)]
    pub images: Vec<Attachment>,
    #[serde(default)]
    /// The usage it reports.
    pub usage: Usage,
    /// Wait this long before answering (tokio time, so paused-time tests
    /// do not really wait).
    #[serde(
        default,
        rename = "delay_ms",
        with = "millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub delay: Option<Duration>,
    /// Fail the first `fail_times` calls at this step with this message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    #[serde(default)]
    /// How many calls at this step fail with `failure` before it answers.
    pub fail_times: u32,
}

impl ScriptedReply {
    /// A final answer.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }

    /// An answer asking for tool calls.
    pub fn tool_calls(calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls: calls,
            ..Self::default()
        }
    }

    /// Carries `reasoning` before its text.
    pub fn with_reasoning(mut self, reasoning: Reasoning) -> Self {
        self.reasoning = Some(reasoning);
        self
    }

    /// Carries provider metadata to be sent back.
    pub fn with_provider_metadata(mut self, metadata: ProviderMetadata) -> Self {
        self.provider_metadata = Some(metadata);
        self
    }

    /// Carries an image (a chart it drew, say) before its text.
    pub fn with_image(mut self, image: Attachment) -> Self {
        self.images.push(image);
        self
    }

    /// The answer's content: its reasoning, its images, then its text
    /// (none when it is empty and there is reasoning or an image).
    pub fn content(&self) -> Content {
        if self.reasoning.is_none() && self.images.is_empty() {
            return Content::from(self.text.clone());
        }
        let mut parts: Vec<Part> = self
            .reasoning
            .iter()
            .cloned()
            .map(Part::Reasoning)
            .collect();
        parts.extend(self.images.iter().cloned().map(Part::Image));
        if !self.text.is_empty() {
            parts.push(Part::text(self.text.clone()));
        }
        Content::new(parts)
    }

    /// The assistant message this answer becomes in the transcript.
    fn message(&self) -> Message {
        Message::Assistant {
            content: self.content(),
            tool_calls: self.tool_calls.clone(),
            provider_metadata: self.provider_metadata.clone(),
        }
    }

    /// Reports `usage` for this answer.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }

    /// Waits `delay` before answering.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Fails the first `times` calls at this step, then answers.
    pub fn failing_first(mut self, times: u32, message: impl Into<String>) -> Self {
        self.failure = Some(message.into());
        self.fail_times = times;
        self
    }
}

/// Answers from a script. The reply for a call is chosen by the turn within
/// the request (the number of assistant messages after the last user
/// message), not by how often it was called: a run resumed in another
/// process, or a retried turn, gets the same reply the crashed run would
/// have got. Every request of a conversation starts the script over.
#[derive(Debug)]
pub struct ScriptedModel {
    name: String,
    replies: Vec<ScriptedReply>,
    calls: AtomicU64,
    failures_left: Mutex<Vec<u32>>,
    strict: bool,
}

impl ScriptedModel {
    /// A model named `scripted` that answers with `replies`.
    pub fn new(replies: Vec<ScriptedReply>) -> Self {
        Self::named("scripted", replies)
    }

    /// A scripted model with a name of its own (part of the agent fingerprint).
    pub fn named(name: impl Into<String>, replies: Vec<ScriptedReply>) -> Self {
        let failures_left = Mutex::new(replies.iter().map(|r| r.fail_times).collect());
        Self {
            name: name.into(),
            replies,
            calls: AtomicU64::new(0),
            failures_left,
            strict: false,
        }
    }

    /// Fails a call (not retryable) whose earlier assistant turns of the
    /// request are not its own answers exactly, reasoning, signatures,
    /// provider metadata and images' bytes included, as a provider refuses
    /// a tool loop whose reasoning did not come back.
    pub fn requiring_answers_back(mut self) -> Self {
        self.strict = true;
        self
    }

    /// How many times the model was called (failed calls included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// The script.
    pub fn replies(&self) -> &[ScriptedReply] {
        &self.replies
    }

    fn step_of(messages: &[Message]) -> usize {
        messages
            .iter()
            .rev()
            .take_while(|m| !matches!(m, Message::User { .. }))
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count()
    }

    /// The first of this request's assistant turns that is not the
    /// script's answer for its step, exactly.
    fn altered_answer(&self, messages: &[Message]) -> Option<usize> {
        let start = messages
            .iter()
            .rposition(|m| matches!(m, Message::User { .. }))
            .map_or(0, |i| i + 1);
        messages[start..]
            .iter()
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .enumerate()
            .find(|(step, sent)| {
                let Some(own) = self.replies.get(*step).map(ScriptedReply::message) else {
                    return true;
                };
                // Attachments are equal by their hash; their bytes must
                // have come back too.
                let bytes = |m: &Message| -> Vec<Option<Vec<u8>>> {
                    m.content()
                        .attachments()
                        .map(|a| a.bytes().map(|b| b.to_vec()))
                        .collect()
                };
                own != **sent || bytes(&own) != bytes(sent)
            })
            .map(|(step, _)| step)
    }

    fn take_failure(&self, step: usize) -> bool {
        // A poisoned lock only means another call panicked mid-update; the
        // counters are still usable.
        let mut left = self.failures_left.lock().unwrap_or_else(|p| p.into_inner());
        match left.get_mut(step) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

#[async_trait]
impl Model for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let step = Self::step_of(request.messages);
        let reply = self.replies.get(step).ok_or_else(|| {
            ModelError::fatal(format!(
                "script exhausted at step {step} of {}",
                self.replies.len()
            ))
        })?;
        if self.strict {
            if let Some(altered) = self.altered_answer(request.messages) {
                return Err(ModelError::fatal(format!(
                    "the answer of step {altered} was not sent back exactly (reasoning, \
                     signature, provider metadata or an image lost or changed)"
                )));
            }
        }
        if let Some(delay) = reply.delay {
            tokio::time::sleep(delay).await;
        }
        if let Some(message) = &reply.failure {
            if self.take_failure(step) {
                return Err(ModelError::retryable(message.clone()));
            }
        }
        if let Some(deltas) = request.deltas {
            for word in reply.text.split_inclusive(' ') {
                deltas(word);
            }
        }
        Ok(ModelResponse {
            content: reply.content(),
            tool_calls: reply.tool_calls.clone(),
            provider_metadata: reply.provider_metadata.clone(),
            usage: reply.usage,
        })
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed() -> ScriptedReply {
        ScriptedReply::tool_calls(vec![ToolCall::new("c1", "t", serde_json::json!({}))])
            .with_reasoning(Reasoning {
                provider: "anthropic".into(),
                text: Some("think".into()),
                signature: Some("sig".into()),
                redacted: None,
            })
            .with_provider_metadata(ProviderMetadata::new(r#"{"k": 1}"#).expect("object"))
    }

    async fn second_call(
        model: &ScriptedModel,
        answer: Message,
    ) -> Result<ModelResponse, ModelError> {
        let messages = [
            Message::user("go"),
            answer,
            Message::tool("c1", "done", false),
        ];
        model
            .respond(ModelRequest {
                messages: &messages,
                tools: &[],
                deltas: None,
                deadline: None,
            })
            .await
    }

    #[tokio::test]
    async fn a_model_requiring_its_answers_back_fails_a_call_that_lost_or_changed_one() {
        let model =
            ScriptedModel::new(vec![signed(), ScriptedReply::text("ok")]).requiring_answers_back();
        let exact = signed().message();
        let answered = second_call(&model, exact.clone())
            .await
            .expect("exact answers");
        assert_eq!(answered.content, Content::from("ok"));

        let Message::Assistant {
            content,
            tool_calls,
            provider_metadata,
        } = exact
        else {
            unreachable!()
        };
        let text_only = Message::Assistant {
            content: Content::from(content.text().into_owned()),
            tool_calls: tool_calls.clone(),
            provider_metadata: provider_metadata.clone(),
        };
        let no_metadata = Message::Assistant {
            content,
            tool_calls,
            provider_metadata: None,
        };
        for altered in [text_only, no_metadata] {
            let err = second_call(&model, altered).await.expect_err("refused");
            assert!(!err.retryable, "{err:?}");
            assert!(err.to_string().contains("not sent back exactly"), "{err}");
        }

        let lenient = ScriptedModel::new(vec![signed(), ScriptedReply::text("ok")]);
        let lost = Message::assistant_with_calls("", signed().tool_calls);
        assert!(second_call(&lenient, lost).await.is_ok());
    }
}
