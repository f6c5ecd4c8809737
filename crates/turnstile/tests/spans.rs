// A binary of its own: it installs the process's tracing subscriber, which
// other tests' threads would share.
//! Model and tool calls run in spans that carry OpenTelemetry's GenAI
//! semantic-convention fields, so a `tracing` to OpenTelemetry bridge gets
//! standard traces: operation, provider, model, usage, tool, conversation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;
use turnstile::{
    AgentSession, ContextPolicy, ConversationId, Namespace, RequestId, RunContext, ScriptedModel,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

/// A span's name and its fields, each as text.
type Seen = (String, BTreeMap<String, String>);

/// Each span seen, in the order the spans opened.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Seen>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Where a span's index in [`Spans`] is kept.
struct Index(usize);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        spans.push((attrs.metadata().name().to_owned(), fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Index(spans.len() - 1));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(Index(i)) = span.extensions().get::<Index>().map(|i| Index(i.0)) else {
            return;
        };
        values.record(&mut Fields(&mut self.0.lock().unwrap()[i].1));
    }
}

// The subscriber is this test thread's only (`set_default`), and the
// runtime is current-thread, so the spawned tool task reports here too.
#[tokio::test(flavor = "current_thread")]
async fn model_and_tool_calls_carry_the_genai_fields() {
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let model = Arc::new(ScriptedModel::named(
        "openai:gpt-test",
        vec![
            tools_reply(vec![call("c1", "count")], usage(7, 3)),
            text_reply("done", usage(11, 2)),
        ],
    ));
    let conversation_id = ConversationId::new();
    let session = AgentSession::new(
        agent(model, vec![CountingTool::new("count")]),
        memory_store().await,
        conversation_id,
        Namespace::new("tests").unwrap(),
        ContextPolicy::default(),
    );
    session
        .run(RequestId::new(), "count once", RunContext::default())
        .await
        .unwrap();

    let spans = spans.0.lock().unwrap().clone();
    let of = |name: &str| -> Vec<BTreeMap<String, String>> {
        spans
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, fields)| fields.clone())
            .collect()
    };
    let conversation = conversation_id.to_string();
    let chats = of("chat");
    assert_eq!(chats.len(), 2, "{spans:?}");
    for (chat, (input, output)) in chats.iter().zip([("7", "3"), ("11", "2")]) {
        assert_eq!(chat["gen_ai.operation.name"], "chat");
        assert_eq!(chat["gen_ai.provider.name"], "openai");
        assert_eq!(chat["gen_ai.request.model"], "gpt-test");
        assert_eq!(chat["otel.name"], "chat gpt-test");
        assert_eq!(chat["gen_ai.conversation.id"], conversation);
        assert_eq!(chat["gen_ai.usage.input_tokens"], input);
        assert_eq!(chat["gen_ai.usage.output_tokens"], output);
    }
    let tools = of("execute_tool");
    assert_eq!(tools.len(), 1, "{spans:?}");
    assert_eq!(tools[0]["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tools[0]["gen_ai.tool.name"], "count");
    assert_eq!(tools[0]["gen_ai.tool.call.id"], "c1");
    assert_eq!(tools[0]["gen_ai.conversation.id"], conversation);
}
