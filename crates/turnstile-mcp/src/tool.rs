//! One MCP tool as a turnstile [`Tool`]: its call goes to the server with
//! the call's idempotency key in `_meta`, its result comes back as parts.

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::ServiceError;
use serde_json::Value;

use turnstile_core::agent::{Tool, ToolContext, ToolError};
use turnstile_core::message::{Content, ToolSpec};

use crate::content::result_content;
use crate::server::{McpServer, McpToolInfo};
use crate::IDEMPOTENCY_KEY_META;

pub(crate) struct McpTool {
    server: Arc<McpServer>,
    info: McpToolInfo,
}

impl McpTool {
    pub(crate) fn new(server: Arc<McpServer>, info: McpToolInfo) -> Self {
        Self { server, info }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.info.name.clone(),
            description: self.info.description.clone(),
            parameters: self.info.input_schema.clone(),
        }
    }

    async fn call(&self, arguments: Value, context: ToolContext) -> Result<Content, ToolError> {
        let Value::Object(arguments) = arguments else {
            return Err(ToolError::new("the arguments must be a JSON object"));
        };
        let mut params =
            CallToolRequestParams::new(self.info.name.clone()).with_arguments(arguments);
        let mut meta = RequestMetaObject::new();
        meta.insert(
            IDEMPOTENCY_KEY_META.to_owned(),
            Value::String(context.idempotency_key.clone()),
        );
        params.meta = Some(meta);
        let server = self.server.name();
        if self.server.client.is_transport_closed() {
            return Err(ToolError::new(format!(
                "the MCP server {server} is gone (it exited or closed the connection before): \
                 the call was not sent"
            )));
        }
        let result = self
            .server
            .client
            .call_tool(params)
            .await
            .map_err(|e| match e {
                // The server may have acted before it went, or before it
                // was given up on.
                ServiceError::TransportClosed
                | ServiceError::Cancelled { .. }
                | ServiceError::Timeout { .. }
                | ServiceError::UnexpectedResponse => ToolError::new(format!(
                    "the MCP server {server} did not answer the call ({e}): the call may or may \
                     not have taken effect"
                )),
                other => {
                    ToolError::new(format!("the MCP server {server} failed the call: {other}"))
                }
            })?;
        let content = result_content(&result)?;
        if result.is_error == Some(true) {
            let text = content.text();
            return Err(ToolError::new(match text.trim().is_empty() {
                true => format!("the tool failed without saying why (MCP server {server})"),
                false => text.into_owned(),
            }));
        }
        Ok(content)
    }
}
