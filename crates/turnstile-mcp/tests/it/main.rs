//! The MCP client against a real MCP server: the test kit's Python server
//! on the official SDK, started as a child process.

mod mcp_crash;
mod mcp_http;
mod mcp_stdio;
