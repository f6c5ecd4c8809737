//! The OpenAI client's integration tests, one module per behaviour, linked
//! into one binary. `openai_config` is a binary of its own.

mod llama_server;
mod openai_crash;
mod openai_errors;
mod openai_finish;
mod openai_images;
mod openai_metadata;
mod openai_model;
mod openai_reasoning;
mod support;
