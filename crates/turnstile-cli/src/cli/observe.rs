//! Wrappers that report what a model and its tools do, for progress lines.
//!
//! The stream of a fresh request carries events, but its [`Event::ToolFinished`]
//! does not carry the call's arguments and result, and `resume_run` and
//! `recover_after_owner_exit` have no event stream at all. These wrappers
//! send a [`Note`] for every model answer and tool result instead. They
//! delegate the name and specs, so the agent fingerprint is unchanged.
//!
//! [`Event::ToolFinished`]: turnstile::Event::ToolFinished

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc::UnboundedSender;

use turnstile::agent::{Model, ModelRequest, ModelResponse, Tool, ToolContext, ToolError};
use turnstile::message::{ToolSpec, Usage};
use turnstile::ModelError;

/// Something the agent did.
#[derive(Clone, Debug)]
pub enum Note {
    Model {
        tool_calls: usize,
        usage: Usage,
    },
    Tool {
        turn: u32,
        call_id: String,
        name: String,
        arguments: String,
        result: Result<String, String>,
    },
}

pub type Notes = UnboundedSender<Note>;

/// A model that reports every answer.
pub struct ObservedModel {
    pub inner: Arc<dyn Model>,
    pub notes: Notes,
}

#[async_trait]
impl Model for ObservedModel {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let response = self.inner.respond(request).await?;
        let _ = self.notes.send(Note::Model {
            tool_calls: response.tool_calls.len(),
            usage: response.usage,
        });
        Ok(response)
    }
}

/// A tool that reports every call with its arguments and result.
pub struct ObservedTool {
    pub inner: Arc<dyn Tool>,
    pub notes: Notes,
}

#[async_trait]
impl Tool for ObservedTool {
    fn spec(&self) -> ToolSpec {
        self.inner.spec()
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        context: ToolContext,
    ) -> Result<String, ToolError> {
        let shown = arguments.to_string();
        let (turn, call_id) = (context.turn, context.call_id.clone());
        let result = self.inner.call(arguments, context).await;
        let _ = self.notes.send(Note::Tool {
            turn,
            call_id,
            name: self.inner.spec().name,
            arguments: shown,
            result: result.clone().map_err(|e| e.0),
        });
        result
    }
}
