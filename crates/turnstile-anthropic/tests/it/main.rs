//! The Anthropic Messages client against a fake of the API on loopback
//! (`support`) and against llama.cpp's `llama-server`, which speaks the
//! protocol too.

mod anthropic_crash;
mod anthropic_errors;
mod anthropic_model;
mod anthropic_stops;
mod llama_messages;
mod support;
