//! Ctrl-C during `run`, `resume` and `recover`: the first SIGINT cancels the
//! run's [`CancellationToken`], so the loop stops at a clean point, settles
//! the turn's checkpoint and returns `Cancelled` (the command prints how to
//! resume); a second SIGINT exits at once with 130, as an impatient user
//! expects (the run is then resumable like a crashed one).

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Watches for SIGINT while it lives.
pub(super) struct Interrupt {
    token: CancellationToken,
    _watch: AbortOnDropHandle<()>,
}

impl Interrupt {
    /// Starts watching. Call it inside the runtime, before the run starts.
    pub(super) fn watch() -> Self {
        let token = CancellationToken::new();
        let cancel = token.clone();
        let watch = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_err() {
                return; // no signal handling here: Ctrl-C keeps its default
            }
            tracing::info!("interrupted: cancelling the run at its next clean point");
            cancel.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        });
        Self {
            token,
            _watch: AbortOnDropHandle::new(watch),
        }
    }

    /// The token to put in the run's `RunContext`.
    pub(super) fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}
