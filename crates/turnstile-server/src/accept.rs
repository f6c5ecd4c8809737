//! The connections: hyper's HTTP/1 with a deadline for each request's head
//! (`axum::serve` sets none, so a client sending its headers a byte at a
//! time would hold its connection for ever), and a graceful shutdown that
//! stops accepting, lets each open response finish, and cuts off what is
//! still open a while after the runs ended.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// How long the connections still open once the runs ended may take to
/// finish (a client that stopped reading its event stream, say).
const GRACE: Duration = Duration::from_secs(10);

/// The connections open when accepting stopped, finishing.
pub(crate) struct Draining {
    finished: JoinHandle<()>,
    connections: JoinSet<()>,
}

impl Draining {
    /// Waits [`GRACE`] at most for the connections to finish, then cuts
    /// off the rest.
    pub(crate) async fn finish(mut self) {
        if tokio::time::timeout(GRACE, &mut self.finished)
            .await
            .is_err()
        {
            tracing::warn!("connections still open {GRACE:?} after the runs ended were cut off");
            self.connections.abort_all();
        }
    }
}

/// Serves `router` on each connection `listener` accepts until `shutdown`
/// resolves; then stops accepting and asks each connection to finish.
pub(crate) async fn accept(
    listener: TcpListener,
    router: Router,
    head_within: Duration,
    shutdown: impl Future<Output = ()>,
) -> Draining {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, say: the connections open go
                // on, and accepting resumes a moment later.
                Err(error) => {
                    tracing::warn!(%error, "could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // The ones that ended are let go.
        while connections.try_join_next().is_some() {}
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(head_within)
            .serve_connection(
                TokioIo::new(stream),
                TowerToHyperService::new(router.clone()),
            );
        let connection = graceful.watch(connection);
        connections.spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a connection ended with an error");
            }
        });
    }
    drop(listener);
    Draining {
        finished: tokio::spawn(graceful.shutdown()),
        connections,
    }
}
