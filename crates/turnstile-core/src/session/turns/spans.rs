//! The spans of model and tool calls, with the fields of OpenTelemetry's
//! GenAI semantic conventions on plain `tracing` spans: an application that
//! bridges `tracing` to OpenTelemetry (`tracing-opentelemetry`) gets
//! standard GenAI traces, and the engine depends on neither.

use tracing::field::Empty;
use tracing::Span;

use crate::ids::ConversationId;
use crate::message::Usage;

/// The span of one model call (`chat`): the provider and model from the
/// model's name (`openai:gpt-4o` is provider `openai`, model `gpt-4o`; a
/// name without a colon is both), the conversation, and the usage once it
/// answers ([`record_usage`]).
pub(crate) fn model_call(model_name: &str, conversation_id: ConversationId) -> Span {
    let (provider, model) = model_name
        .split_once(':')
        .unwrap_or((model_name, model_name));
    tracing::info_span!(
        "chat",
        otel.name = %format_args!("chat {model}"),
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.conversation.id = %conversation_id,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
    )
}

/// Records what a model call used on its span.
pub(crate) fn record_usage(span: &Span, usage: &Usage) {
    span.record("gen_ai.usage.input_tokens", usage.input_tokens);
    span.record("gen_ai.usage.output_tokens", usage.output_tokens);
}

/// The span of one tool call (`execute_tool`). The call id is the model's
/// text: at most its first 64 characters are recorded.
pub(crate) fn tool_call(name: &str, call_id: &str, conversation_id: ConversationId) -> Span {
    let call_id = match call_id.char_indices().nth(64) {
        Some((cut, _)) => &call_id[..cut],
        None => call_id,
    };
    tracing::info_span!(
        "execute_tool",
        otel.name = %format_args!("execute_tool {name}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.call.id = call_id,
        gen_ai.conversation.id = %conversation_id,
    )
}
