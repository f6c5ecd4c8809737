//! One MCP tool as a turnstile [`Tool`]: its call goes to the server with
//! the call's idempotency key in `_meta`, its result comes back as parts;
//! a call in doubt is reconciled through the server's
//! [`RECONCILE_TOOL`](crate::RECONCILE_TOOL) when it offers one.

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::ServiceError;
use serde_json::{json, Map, Value};

use turnstile_core::agent::{Reconciliation, Tool, ToolContext, ToolError};
use turnstile_core::message::{Content, ToolSpec};

use crate::content::{blocks_content, result_content};
use crate::server::{McpServer, McpToolInfo};
use crate::{IDEMPOTENCY_KEY_META, RECONCILE_TOOL};

pub(crate) struct McpTool {
    server: Arc<McpServer>,
    /// The name the model calls it by: its own, or prefixed when another
    /// tool of the agent has its own.
    exposed: String,
    info: McpToolInfo,
    /// Whether a call in doubt runs again (the policy's word on it).
    idempotent: bool,
}

impl McpTool {
    pub(crate) fn new(
        server: Arc<McpServer>,
        exposed: String,
        info: McpToolInfo,
        idempotent: bool,
    ) -> Self {
        Self {
            server,
            exposed,
            info,
            idempotent,
        }
    }

    /// Sends `tools/call` of `name` with the call's idempotency key.
    async fn send(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        context: &ToolContext,
    ) -> Result<CallToolResult, ToolError> {
        let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        let mut meta = RequestMetaObject::new();
        meta.insert(
            IDEMPOTENCY_KEY_META.to_owned(),
            Value::String(context.idempotency_key.clone()),
        );
        params.meta = Some(meta);
        let server = self.server.name();
        let connection = self.server.connection().await?;
        let answer = connection.client.call_tool(params).await;
        match answer {
            Ok(answer) => {
                self.server.answered();
                Ok(answer)
            }
            // The server may have acted before it went, or before it was
            // given up on: the call is in doubt.
            Err(
                e @ (ServiceError::TransportClosed
                | ServiceError::Cancelled { .. }
                | ServiceError::Timeout { .. }
                | ServiceError::UnexpectedResponse),
            ) => Err(ToolError::in_doubt(format!(
                "the MCP server {server} did not answer the call ({e})"
            ))),
            Err(other) => Err(ToolError::new(format!(
                "the MCP server {server} failed the call: {other}"
            ))),
        }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.exposed.clone(),
            description: self.info.description.clone(),
            parameters: self.info.input_schema.clone(),
        }
    }

    async fn call(&self, arguments: Value, context: ToolContext) -> Result<Content, ToolError> {
        let Value::Object(arguments) = arguments else {
            return Err(ToolError::new("the arguments must be a JSON object"));
        };
        if !self.server.still_offers(&self.info).await {
            return Err(ToolError::new(format!(
                "the MCP server {} no longer offers the tool {:?} as the agent was built with \
                 (its tools changed): the call was not sent; build the agent again to take \
                 its tools as they are now",
                self.server.name(),
                self.info.name
            )));
        }
        let result = self.send(&self.info.name, arguments, &context).await?;
        let content = result_content(&result)?;
        if result.is_error == Some(true) {
            return Err(failure(&content, self.server.name()));
        }
        Ok(content)
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    /// Asks the server's [`RECONCILE_TOOL`], when it offers one; anything
    /// but a clear `done` or `not_done` answer is unknown.
    async fn reconcile(&self, arguments: Value, context: ToolContext) -> Reconciliation {
        if !self.server.reconciles() {
            return Reconciliation::Unknown;
        }
        let question = json!({
            "tool": self.info.name,
            "idempotency_key": context.idempotency_key,
            "arguments": arguments,
        });
        let Value::Object(question) = question else {
            return Reconciliation::Unknown;
        };
        let answer = match self.send(RECONCILE_TOOL, question, &context).await {
            Ok(answer) if answer.is_error != Some(true) => answer,
            Ok(_) | Err(_) => return Reconciliation::Unknown,
        };
        let status = answer
            .structured_content
            .as_ref()
            .and_then(|s| s.get("status"))
            .and_then(Value::as_str);
        match status {
            Some("done") => {
                let failed = answer
                    .structured_content
                    .as_ref()
                    .and_then(|s| s.get("failed"))
                    .and_then(Value::as_bool)
                    == Some(true);
                Reconciliation::Done(match blocks_content(&answer.content) {
                    Ok(content) if failed => Err(failure(&content, self.server.name())),
                    answered => answered,
                })
            }
            Some("not_done") => Reconciliation::NotDone,
            _ => Reconciliation::Unknown,
        }
    }
}

/// A failed call's error, with the server's text when it gave one.
fn failure(content: &Content, server: &str) -> ToolError {
    let text = content.text();
    ToolError::new(match text.trim().is_empty() {
        true => format!("the tool failed without saying why (MCP server {server})"),
        false => text.into_owned(),
    })
}
