//! `events CONVERSATION`: the conversation's event log as JSON Lines, one
//! object per durable step, and with `--follow` each new one as its step
//! commits, in this process or another.

use std::io::Write;
use std::pin::pin;

use super::args::EventsArgs;
use super::inspect::find;
use crate::cli::access::Access;
use crate::cli::exit::CliError;
use crate::cli::interrupt::stopping;
use crate::cli::output;
use crate::cli::store::open_store;

/// Events read per query.
const PAGE: u32 = 500;

pub(in crate::cli) async fn events(args: EventsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if args.poll.is_zero() {
        return Err(CliError::Usage(
            "--poll must be longer than 0s: it is how long --follow waits between looks".into(),
        ));
    }
    let store = open_store(&args.db, Access::Read).await?;
    let result = async {
        let conversation = find(store.as_ref(), args.conversation, args.namespace.as_ref()).await?;
        let mut stop = pin!(stopping());
        let mut after = args.after;
        loop {
            let page = store.events_after(conversation.id, after, PAGE).await?;
            for event in &page {
                output::json(out, event)?;
                after = event.seq;
            }
            out.flush()?;
            if page.len() == PAGE as usize {
                continue;
            }
            if !args.follow {
                return Ok(());
            }
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(args.poll) => {}
            }
        }
    }
    .await;
    crate::cli::store::closed(store.as_ref(), result).await
}
