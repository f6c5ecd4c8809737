//! The command line's integration tests, one module per behaviour, linked
//! into one binary: most run the built `turnstile` binary on temporary
//! databases (`cli_support`); `bad_input` and `security` also drive the
//! library directly.

mod bad_input;
mod cli_anthropic;
mod cli_approvals;
mod cli_bad_input;
mod cli_bench;
mod cli_budget;
mod cli_delete_fork;
mod cli_demo;
mod cli_events;
mod cli_json;
mod cli_leases;
mod cli_mcp;
mod cli_meta;
mod cli_ops;
mod cli_parts;
mod cli_postgres;
mod cli_read_only;
mod cli_retention;
mod cli_serve;
mod cli_serve_takeover;
mod cli_session;
mod cli_support;
mod cli_tokens;
mod security;
