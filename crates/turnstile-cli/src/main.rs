//! The `turnstile` binary: parses the arguments, installs the tracing
//! subscriber and runs the command (`cli/`). The durable logic is the library's.

mod cli;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return cli::parse_failure(error),
    };
    install_tracing();
    let stdout = std::io::stdout();
    let style = cli::Style {
        terminal: stdout.is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    match cli::main(cli, &mut stdout.lock(), style) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): nothing is wrong, and nobody is
        // left to tell.
        Err(error) if error.is_closed_output() => ExitCode::SUCCESS,
        Err(error) => {
            // An error can quote an endpoint's body or a tool's name.
            cli::report(&format!("error: {}", cli::output::plain(&error.one_line())));
            ExitCode::from(error.exit_code())
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `warn`, sqlx's queries
/// `error`).
fn install_tracing() {
    let configured = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
    let filter = configured
        .as_deref()
        .and_then(|v| EnvFilter::try_new(v).ok())
        // sqlx warns of any statement over a second; here that is a write
        // waiting out another process's lock, which the exit code reports.
        .unwrap_or_else(|| EnvFilter::new("warn,sqlx::query=error"));
    // The library logs every error it returns (`#[instrument(err)]`); the
    // command prints that same error as its `error:` line, so by default
    // those events are dropped to keep failures to one line. Set RUST_LOG
    // to see them.
    let quiet_returned_errors = configured.is_none();
    let returned_error = move |meta: &tracing::Metadata<'_>| {
        !(quiet_returned_errors
            && meta.is_event()
            && *meta.level() == tracing::Level::ERROR
            && meta.target().starts_with("turnstile")
            && meta.fields().field("error").is_some())
    };
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter_fn(returned_error));
    // The level filter for the whole subscriber, not for the layer alone: a
    // span it disables is then never created (as a per-layer filter, every
    // request's and step's spans were made and dropped unseen).
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
}
