//! Ctrl-C, SIGTERM and SIGHUP during `run`, `resume` and `recover`: the
//! first of them cancels the run's [`CancellationToken`], so the loop stops
//! at a clean point, settles the turn's checkpoint and returns `Cancelled`
//! (the command prints how to resume); a second one exits at once with
//! 128 + its number (130 for Ctrl-C), as an impatient user or a supervisor
//! expects (the run is then resumable like a crashed one).

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Watches for the stopping signals while it lives.
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
            let Some(mut stops) = Stops::install() else {
                return; // no signal handling here: the signals keep their defaults
            };
            let first = stops.next().await;
            tracing::info!(
                signal = first,
                "stopping: cancelling the run at its next clean point"
            );
            cancel.cancel();
            let second = stops.next().await;
            std::process::exit(128 + second);
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

/// Resolves on the first stopping signal (SIGINT, SIGTERM, SIGHUP) after
/// the call; never where signals cannot be watched. The handlers are in
/// place when it returns, before the future is first polled.
pub(super) fn stopping() -> impl std::future::Future<Output = ()> {
    let stops = Stops::install();
    async move {
        match stops {
            Some(mut stops) => {
                stops.next().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
}

/// The signals that ask a command to stop.
struct Stops {
    #[cfg(unix)]
    unix: [(tokio::signal::unix::Signal, i32); 3],
}

impl Stops {
    #[cfg(unix)]
    fn install() -> Option<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        const SIGHUP: i32 = 1;
        const SIGINT: i32 = 2;
        const SIGTERM: i32 = 15;
        Some(Self {
            unix: [
                (signal(SignalKind::interrupt()).ok()?, SIGINT),
                (signal(SignalKind::terminate()).ok()?, SIGTERM),
                (signal(SignalKind::hangup()).ok()?, SIGHUP),
            ],
        })
    }

    #[cfg(not(unix))]
    fn install() -> Option<Self> {
        Some(Self {})
    }

    /// The number of the next stopping signal.
    #[cfg(unix)]
    async fn next(&mut self) -> i32 {
        let [(int, n_int), (term, n_term), (hup, n_hup)] = &mut self.unix;
        tokio::select! {
            _ = int.recv() => *n_int,
            _ = term.recv() => *n_term,
            _ = hup.recv() => *n_hup,
        }
    }

    #[cfg(not(unix))]
    async fn next(&mut self) -> i32 {
        const SIGINT: i32 = 2;
        match tokio::signal::ctrl_c().await {
            Ok(()) => SIGINT,
            Err(_) => std::future::pending().await,
        }
    }
}
