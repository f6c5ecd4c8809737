//! `serve`: the HTTP server of `turnstile-server` on a database, with the
//! command-line agent, until Ctrl-C or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;

use clap::Args;
use tokio::net::TcpListener;

use super::access::Access;
use super::agent::agent_requiring;
use super::agent_args::AgentArgs;
use super::db::DbLocation;
use super::exit::CliError;
use super::interrupt::stopping;
use super::lease::LeaseTiming;
use super::model;
use super::store::{closed, open_store};
use turnstile::ids::Namespace;
use turnstile::server::Server;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The database: a SQLite file (created when missing), or a PostgreSQL
    /// URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The address to listen on (port 0: any free port; the address taken
    /// is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The namespace every conversation of this server lives in (without
    /// --tokens).
    #[arg(long, value_name = "NS", default_value = Namespace::DEFAULT, conflicts_with = "tokens")]
    pub namespace: Namespace,
    /// Tenants: each request names its namespace by a token of `turnstile
    /// token create` (`Authorization: Bearer …`); without one it is 401.
    /// Needed to listen on an address other than loopback.
    #[arg(long)]
    pub tokens: bool,
    // Each run holds a lease; once a server's lease expired (it died or
    // froze), another server on the database, or this one restarted,
    // takes the request over from its last checkpoint.
    #[command(flatten)]
    pub lease: LeaseTiming,
    #[command(flatten)]
    pub agent: AgentArgs,
}

pub(super) async fn serve(args: ServeArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if !args.tokens && !args.listen.ip().is_loopback() {
        return Err(CliError::Usage(format!(
            "serving {} without --tokens would let anyone who reaches it use every \
             conversation: pass --tokens (and give each tenant a token of `turnstile token \
             create`), or listen on 127.0.0.1",
            args.listen
        )));
    }
    let lease = args.lease.policy()?;
    let approval = args.agent.approval.tools()?;
    let model = model::load(&args.agent.model)?;
    let mcp = args.agent.mcp.connect().await?;
    let store = open_store(&args.db, Access::Create(Default::default())).await?;
    let result = async {
        let listener = TcpListener::bind(args.listen)
            .await
            .map_err(CliError::io("listen on the address given"))?;
        let address = listener
            .local_addr()
            .map_err(CliError::io("read the address listened on"))?;
        writeln!(out, "listening on http://{address}")?;
        out.flush()?;
        let agent = agent_requiring(model, &approval, &mcp);
        let server = Server::new(store.clone(), agent, args.namespace).with_lease(lease);
        let server = match args.tokens {
            true => server.with_tokens(),
            false => server,
        };
        turnstile::server::serve(listener, server, stopping()).await;
        Ok(())
    }
    .await;
    closed(store.as_ref(), result).await
}
