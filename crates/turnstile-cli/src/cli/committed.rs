//! What `run`, `resume` and `recover` print once a request is committed
//! (or replayed).

use std::io::Write;

use serde::Serialize;

use super::exit::CliError;
use super::output::{self, Style};
use turnstile::ids::{ConversationId, Revision};
use turnstile::outcome::Outcome;
use turnstile::store::Store;

pub(super) async fn show_outcome(
    out: &mut dyn Write,
    style: Style,
    json: bool,
    store: &dyn Store,
    conversation_id: ConversationId,
    outcome: &Outcome,
) -> Result<(), CliError> {
    // Informational: another request may have moved it since.
    let revision = store.admission(conversation_id).await?.revision;
    if json {
        let committed = Committed {
            conversation_id,
            outcome,
            revision,
        };
        return output::json(out, &committed);
    }
    let resumed_from = store
        .run(outcome.run_id)
        .await?
        .and_then(|run| run.resumed_from);
    output::outcome(out, style, outcome, Some(revision.0), resumed_from)
}

/// A committed (or replayed) request as `--json` prints it: the outcome,
/// its conversation, and the admission revision read after it (the
/// `--revision` a later `delete` or takeover compares against).
#[derive(Serialize)]
struct Committed<'a> {
    conversation_id: ConversationId,
    #[serde(flatten)]
    outcome: &'a Outcome,
    revision: Revision,
}
