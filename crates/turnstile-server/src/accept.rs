//! The connections: hyper's HTTP/1 with a deadline for each request's head
//! (`axum::serve` sets none, so a client sending its headers a byte at a
//! time would hold its connection for ever), and a graceful shutdown that
//! stops accepting and lets each open response finish.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Serves `router` on each connection `listener` accepts until `shutdown`
/// resolves, then waits for the open connections to finish their
/// responses, for [`GRACE`] at most.
pub(crate) async fn accept(
    listener: TcpListener,
    router: Router,
    head_within: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
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
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(head_within)
            .serve_connection(
                TokioIo::new(stream),
                TowerToHyperService::new(router.clone()),
            );
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a connection ended with an error");
            }
        });
    }
    drop(listener);
    // A client that stopped reading keeps its response from finishing:
    // it is cut off after a while (the runs are waited for apart).
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(GRACE) => {
            tracing::warn!("connections still open {GRACE:?} after shutdown began were cut off");
        }
    }
}

/// How long the connections open at shutdown may take to finish.
const GRACE: Duration = Duration::from_secs(10);
