//! Following a streamed run: its events printed as progress, to its
//! outcome.

use std::io::Write;

use futures_util::StreamExt;

use super::exit::CliError;
use super::progress::Progress;
use turnstile::events::Event;
use turnstile::ids::{Revision, RunId};
use turnstile::outcome::Outcome;
use turnstile::session::EventStream;

/// Drives a streamed execution, printing its events, to its outcome.
///
/// Output that cannot be written (a closed pipe, a full disk) only stops
/// the printing: the run goes on to its commit or its stop, and the output
/// error is reported after it, so a retry with the same request id
/// replays instead of finding the conversation held.
///
/// `started` is set to the run this stream started and the admission
/// revision it holds, if it got that far: what a resume hint may name.
pub(super) async fn follow(
    mut events: EventStream<'_>,
    progress: &mut Progress,
    out: &mut dyn Write,
    started: &mut Option<(RunId, Revision)>,
) -> Result<Outcome, CliError> {
    let mut printing = Printing::To(out);
    let mut outcome = None;
    while let Some(item) = events.next().await {
        let event = match item {
            Ok(event) => event,
            Err(error) => {
                printing.write(|out| progress.finish(out));
                return Err(error.into());
            }
        };
        if let Event::RunStarted {
            run_id, revision, ..
        } = &event
        {
            *started = Some((*run_id, *revision));
        }
        printing.write(|out| progress.event(out, &event));
        if let Event::ConversationCommitted {
            outcome: committed, ..
        } = event
        {
            outcome = Some(*committed);
        }
    }
    printing.write(|out| progress.finish(out));
    let outcome =
        outcome.ok_or_else(|| CliError::Failed("the run ended without an outcome".into()))?;
    match printing {
        Printing::Failed(error) => Err(error),
        Printing::To(_) => Ok(outcome),
    }
}

/// Where progress goes: the output, until a write to it fails.
enum Printing<'a> {
    To(&'a mut dyn Write),
    Failed(CliError),
}

impl Printing<'_> {
    fn write(&mut self, print: impl FnOnce(&mut dyn Write) -> Result<(), CliError>) {
        if let Printing::To(out) = self {
            if let Err(error) = print(&mut **out) {
                *self = Printing::Failed(error);
            }
        }
    }
}
