//! Building blocks of the crash tortures (the facade's `crash_torture`, on
//! SQLite, and the PostgreSQL backend's, whose other durability tests use
//! them too): a seeded PRNG, the seeded plan of conversations and requests,
//! the scripted agent (a `ScriptedModel` per request, tools whose side
//! effect is a line in an fsync'd log), a store wrapper that traces every
//! store call to stdout so the parent can tell where a SIGKILL landed
//! ([`hooked`]), the crash-free reference run and the checks of what a run
//! committed ([`checks`]), and the torture itself, on any backend
//! ([`kills`]). Nothing here names a store type: every store is an
//! `Arc<dyn Store>` the test opened.
//!
//! Trace lines start with `@`: `@C + KIND DETAIL` when conversation `C`
//! enters a step, `@C - KIND` when it leaves it, and `@C EVENT ...` for
//! single events. Nothing but tracing is added: every call is delegated
//! unchanged.

pub mod checks;
pub mod hooked;
#[cfg(unix)]
pub mod kills;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use turnstile::agent::{ModelRequest, ModelResponse};
use turnstile::{
    Agent, ConversationId, Model, ModelError, Namespace, RequestId, ScriptedModel, ScriptedReply,
    Tool, ToolCall, ToolContext, ToolError, ToolSpec, Usage,
};

use crate::tools::append_line;

/// splitmix64: a tiny seeded PRNG (no random crate in the dependencies).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// An independent stream for `tags` (a conversation, a request, ...).
    pub fn derive(seed: u64, tags: &[u64]) -> Self {
        let mut state = Rng::new(seed).next_u64();
        for &tag in tags {
            state = Rng::new(state ^ tag.wrapping_add(1)).next_u64();
        }
        Rng::new(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (the tiny modulo bias does not matter here).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// A random (version 4) UUID drawn from the stream.
    pub fn uuid(&mut self) -> uuid::Uuid {
        let bits = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
        uuid::Builder::from_random_bytes(bits.to_be_bytes()).into_uuid()
    }
}

/// The conversations driven concurrently by one worker.
pub const CONVERSATIONS: usize = 8;

/// The names of the two tools; both append their idempotency key to the log.
pub const TOOLS: [&str; 2] = ["ledger", "notify"];

pub fn namespace() -> Namespace {
    Namespace::new("torture").expect("valid namespace")
}

/// Everything a run does, derived from the seed alone, so the parent, every
/// worker and the crash-free reference build the same plan.
#[derive(Clone, Debug)]
pub struct Plan {
    pub conversations: Vec<ConversationPlan>,
}

#[derive(Clone, Debug)]
pub struct ConversationPlan {
    pub index: usize,
    pub id: ConversationId,
    pub requests: Vec<RequestPlan>,
}

#[derive(Clone, Debug)]
pub struct RequestPlan {
    pub index: usize,
    pub id: RequestId,
    pub input: String,
    /// One reply per turn: tool turns, then the final answer.
    pub turns: Vec<TurnPlan>,
}

#[derive(Clone, Debug)]
pub struct TurnPlan {
    pub text: String,
    pub calls: Vec<ToolCall>,
    pub usage: Usage,
    /// How long the model takes to answer (workers only).
    pub delay: Duration,
}

impl Plan {
    /// `requests` requests per conversation, each of 2–3 tool turns with 1–2
    /// tool calls and a final answer. Every conversation and request draws
    /// from a stream of its own, so a plan with more requests extends one
    /// with fewer.
    pub fn new(seed: u64, requests: usize) -> Self {
        let conversations = (0..CONVERSATIONS)
            .map(|c| ConversationPlan {
                index: c,
                id: ConversationId::from_uuid(Rng::derive(seed, &[c as u64]).uuid())
                    .expect("non-nil uuid"),
                requests: (0..requests)
                    .map(|r| request_plan(&mut Rng::derive(seed, &[c as u64, r as u64]), c, r))
                    .collect(),
            })
            .collect();
        Self { conversations }
    }

    pub fn requests(&self) -> impl Iterator<Item = (&ConversationPlan, &RequestPlan)> {
        self.conversations
            .iter()
            .flat_map(|c| c.requests.iter().map(move |r| (c, r)))
    }
}

fn request_plan(rng: &mut Rng, c: usize, r: usize) -> RequestPlan {
    let id = RequestId::from_uuid(rng.uuid()).expect("non-nil uuid");
    let tool_turns = rng.range(2, 3) as usize;
    let mut turns = Vec::new();
    for t in 1..=tool_turns + 1 {
        let calls = if t <= tool_turns {
            (0..rng.range(1, 2))
                .map(|k| {
                    let name = TOOLS[rng.range(0, 1) as usize];
                    let args = json!({
                        "item": format!("c{c}-r{r}-t{t}-k{k}"),
                        "before_ms": rng.range(0, 4),
                        "after_ms": rng.range(0, 4),
                    });
                    ToolCall::new(format!("call-{t}-{k}"), name, args)
                })
                .collect()
        } else {
            Vec::new()
        };
        let text = if calls.is_empty() {
            format!("conversation {c} request {r}: done after {t} turns")
        } else {
            format!("conversation {c} request {r} turn {t}: calling tools")
        };
        let usage = Usage {
            input_tokens: rng.range(50, 5000),
            output_tokens: rng.range(5, 500),
            cache_read_tokens: rng.range(0, 100),
            cache_write_tokens: rng.range(0, 10),
        };
        let delay = Duration::from_millis(rng.range(2, 8));
        turns.push(TurnPlan {
            text,
            calls,
            usage,
            delay,
        });
    }
    RequestPlan {
        index: r,
        id,
        input: format!("conversation {c}, request {r}: do the work"),
        turns,
    }
}

impl RequestPlan {
    /// The request's cumulative usage after each turn (index 0: before turn 1).
    pub fn cumulative_usage(&self) -> Vec<Usage> {
        let mut sums = vec![Usage::default()];
        for turn in &self.turns {
            let last = *sums.last().expect("never empty");
            sums.push(last.saturating_add(turn.usage));
        }
        sums
    }

    /// The cumulative tool-call count after each turn (index 0: none).
    pub fn cumulative_calls(&self) -> Vec<u64> {
        let mut sums = vec![0];
        for turn in &self.turns {
            let last = *sums.last().expect("never empty");
            sums.push(last + turn.calls.len() as u64);
        }
        sums
    }

    /// Idempotency keys of every tool call of the request.
    pub fn keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        for (i, turn) in self.turns.iter().enumerate() {
            for call in &turn.calls {
                keys.push(format!("{}/{}/{}", self.id, i + 1, call.id));
            }
        }
        keys
    }
}

/// Prints trace lines for the parent (workers), or nothing (the reference).
#[derive(Clone, Copy, Debug)]
pub struct Tracer {
    pub enabled: bool,
}

impl Tracer {
    pub fn event(&self, conversation: usize, event: &str) {
        if self.enabled {
            println!("@{conversation} {event}");
        }
    }

    /// Awaits `future` between an enter and a leave line of `kind`.
    pub async fn span<T>(
        &self,
        conversation: usize,
        kind: &str,
        detail: impl std::fmt::Display,
        future: impl Future<Output = T>,
    ) -> T {
        self.event(conversation, &format!("+ {kind} {detail}"));
        let value = future.await;
        self.event(conversation, &format!("- {kind}"));
        value
    }
}

/// Chooses the `ScriptedModel` of the request by its input (the last user
/// message) and delegates to it; a `ScriptedModel` picks the reply by the
/// turn within the request, so a retried turn gets the same answer.
pub struct PlanModel {
    conversation: usize,
    scripts: HashMap<String, ScriptedModel>,
    tracer: Tracer,
}

impl PlanModel {
    /// With `paced`, every reply takes its planned delay.
    pub fn new(conversation: &ConversationPlan, paced: bool, tracer: Tracer) -> Self {
        let scripts = conversation
            .requests
            .iter()
            .map(|request| {
                let replies = request
                    .turns
                    .iter()
                    .map(|turn| {
                        let reply = ScriptedReply {
                            text: turn.text.clone(),
                            tool_calls: turn.calls.clone(),
                            usage: turn.usage,
                            ..ScriptedReply::default()
                        };
                        if paced {
                            reply.with_delay(turn.delay)
                        } else {
                            reply
                        }
                    })
                    .collect();
                (request.input.clone(), ScriptedModel::new(replies))
            })
            .collect();
        Self {
            conversation: conversation.index,
            scripts,
            tracer,
        }
    }

    /// Model calls made, failed ones included.
    pub fn calls(&self) -> u64 {
        self.scripts.values().map(ScriptedModel::calls).sum()
    }
}

#[turnstile::async_trait]
impl Model for PlanModel {
    fn name(&self) -> &str {
        "torture-scripted"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let input = crate::session::last_input(request.messages)
            .ok_or_else(|| ModelError::fatal("no user message in the context"))?;
        let script = self
            .scripts
            .get(input)
            .ok_or_else(|| ModelError::fatal(format!("no script for input {input:?}")))?;
        self.tracer
            .span(self.conversation, "model", input, script.respond(request))
            .await
    }
}

/// A tool whose side effect is appending its call's idempotency key to the
/// side-effect log. Paced, it sleeps `before_ms` before the effect and
/// `after_ms` after it, so kills land on both sides of the effect.
pub struct EffectTool {
    pub name: &'static str,
    pub conversation: usize,
    pub log: PathBuf,
    pub paced: bool,
    pub tracer: Tracer,
}

impl EffectTool {
    async fn work(&self, args: &Value, key: &str) -> Result<String, ToolError> {
        let pause = |field: &str| Duration::from_millis(args[field].as_u64().unwrap_or(0));
        if self.paced {
            tokio::time::sleep(pause("before_ms")).await;
        }
        append_line(&self.log, key).map_err(|e| ToolError::new(e.to_string()))?;
        if self.paced {
            tokio::time::sleep(pause("after_ms")).await;
        }
        let item = args["item"].as_str().unwrap_or("?");
        Ok(format!("{} handled {item} as {key}", self.name))
    }
}

#[turnstile::async_trait]
impl Tool for EffectTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.into(),
            description: format!("{}: records an item in the side-effect log", self.name),
            parameters: json!({
                "type": "object",
                "properties": {
                    "item": {"type": "string"},
                    "before_ms": {"type": "integer"},
                    "after_ms": {"type": "integer"},
                }
            }),
        }
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<turnstile::Content, ToolError> {
        let key = ctx.idempotency_key;
        self.tracer
            .span(self.conversation, "tool", &key, self.work(&args, &key))
            .await
            .map(turnstile::Content::from)
    }
}

/// The agent of one conversation: its plan model and both effect tools.
pub fn agent(
    conversation: &ConversationPlan,
    log: &Path,
    paced: bool,
    tracer: Tracer,
) -> (Agent, Arc<PlanModel>) {
    let model = Arc::new(PlanModel::new(conversation, paced, tracer));
    let agent = TOOLS.iter().fold(
        Agent::new(model.clone()).with_system_prompt("do the planned work"),
        |agent, name| {
            agent.with_tool(Arc::new(EffectTool {
                name,
                conversation: conversation.index,
                log: log.to_owned(),
                paced,
                tracer,
            }))
        },
    );
    (agent, model)
}
