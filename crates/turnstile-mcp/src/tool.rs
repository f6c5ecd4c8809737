//! One MCP tool as a turnstile [`Tool`]: its call goes to the server with
//! the call's idempotency key in `_meta`, its result comes back as parts;
//! a call in doubt is reconciled through the server's
//! [`RECONCILE_TOOL`](crate::RECONCILE_TOOL) when it offers one.

use std::sync::Arc;
use std::time::Duration;

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
    /// How long a call may go unanswered before it is in doubt.
    timeout: Duration,
}

impl McpTool {
    pub(crate) fn new(
        server: Arc<McpServer>,
        exposed: String,
        info: McpToolInfo,
        idempotent: bool,
        timeout: Duration,
    ) -> Self {
        Self {
            server,
            exposed,
            info,
            idempotent,
            timeout,
        }
    }

    /// Sends `tools/call` of `name`, with the call's idempotency key in
    /// `_meta` when `key` is given, and waits for the answer at most the
    /// call timeout (the wait for a connection not counted: a call not sent
    /// yet is not in doubt).
    async fn send(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        key: Option<&str>,
    ) -> Result<CallToolResult, ToolError> {
        let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        if let Some(key) = key {
            let mut meta = RequestMetaObject::new();
            meta.insert(
                IDEMPOTENCY_KEY_META.to_owned(),
                Value::String(key.to_owned()),
            );
            params.meta = Some(meta);
        }
        let server = self.server.name();
        let connection = self.server.connection().await?;
        let call = connection.client.call_tool(params);
        let Ok(answer) = tokio::time::timeout(self.timeout, call).await else {
            return Err(ToolError::in_doubt(format!(
                "the MCP server {server} did not answer the call within {} ms",
                self.timeout.as_millis()
            )));
        };
        match answer {
            Ok(answer) => {
                self.server.answered();
                Ok(answer)
            }
            // Refused before it was looked at.
            Err(e) if e.auth_challenge().is_some() => Err(ToolError::new(format!(
                "the MCP server {server} refused the call as unauthorized: check the headers \
                 it is given"
            ))),
            // The server may have acted before it went, or before it was
            // given up on: the call is in doubt.
            Err(
                e @ (ServiceError::TransportClosed
                | ServiceError::TransportSend(_)
                | ServiceError::Cancelled { .. }
                | ServiceError::Timeout { .. }
                | ServiceError::UnexpectedResponse),
            ) => Err(ToolError::in_doubt(format!(
                "the MCP server {server} did not answer the call ({})",
                self.server.redact(&e.to_string())
            ))),
            Err(other) => Err(ToolError::new(format!(
                "the MCP server {server} failed the call: {}",
                self.server.redact(&other.to_string())
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
        let result = self
            .send(&self.info.name, arguments, Some(&context.idempotency_key))
            .await?;
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
        // Without the call's key in `_meta`: a server that deduplicates by
        // it must not take the question for the call.
        let answer = match self.send(RECONCILE_TOOL, question, None).await {
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
