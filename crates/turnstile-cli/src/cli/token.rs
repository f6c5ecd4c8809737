//! `token create|revoke|ls`: the access tokens of `serve --tokens`, each
//! standing for one namespace.

use std::io::Write;

use clap::{Args, Subcommand};

use super::access::Access;
use super::db::DbLocation;
use super::exit::CliError;
use super::ops::utc;
use super::output;
use super::store::{closed, open_store};
use turnstile::ids::Namespace;

#[derive(Args, Debug)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Issues a token for a namespace. Prints its id, then the token as
    /// the last line: it is shown once, and only its SHA-256 is stored.
    Create {
        /// The database: a SQLite file (created when missing), or a
        /// PostgreSQL URL.
        #[arg(long, value_name = "PATH|URL")]
        db: DbLocation,
        /// The namespace the token stands for.
        #[arg(long, value_name = "NS")]
        namespace: Namespace,
    },
    /// Revokes a token: from now on it admits nothing.
    Revoke {
        /// The token's id (as `create` and `ls` print it).
        #[arg(value_name = "ID")]
        id: uuid::Uuid,
        /// The database: a SQLite file, or a PostgreSQL URL.
        #[arg(long, value_name = "PATH|URL")]
        db: DbLocation,
    },
    /// Lists the tokens, oldest first: id, namespace, when created and
    /// revoked. Never a secret.
    Ls {
        /// The database: a SQLite file, or a PostgreSQL URL.
        #[arg(long, value_name = "PATH|URL")]
        db: DbLocation,
    },
}

impl TokenArgs {
    /// The database the command names.
    pub(super) fn db(&self) -> &DbLocation {
        match &self.command {
            TokenCommand::Create { db, .. }
            | TokenCommand::Revoke { db, .. }
            | TokenCommand::Ls { db } => db,
        }
    }
}

pub(super) async fn token(
    args: TokenArgs,
    out: &mut dyn Write,
    json: bool,
) -> Result<(), CliError> {
    let access = match &args.command {
        TokenCommand::Create { .. } => Access::Create(Default::default()),
        TokenCommand::Revoke { .. } => Access::Write(Default::default()),
        TokenCommand::Ls { .. } => Access::Read,
    };
    let store = open_store(args.db(), access).await?;
    let result = async {
        match args.command {
            TokenCommand::Create { namespace, .. } => {
                let issued = store.create_token(&namespace).await?;
                if json {
                    return output::json(out, &issued);
                }
                writeln!(
                    out,
                    "token {} for namespace {}",
                    issued.id, issued.namespace
                )?;
                writeln!(out, "{}", issued.token)?;
                Ok(())
            }
            TokenCommand::Revoke { id, .. } => {
                let revoked = store.revoke_token(id).await?;
                if !revoked {
                    return Err(CliError::Turnstile(turnstile::Error::NotFound {
                        what: "unrevoked token",
                        id: id.to_string(),
                    }));
                }
                match json {
                    true => output::json(out, &serde_json::json!({ "revoked": id })),
                    false => Ok(writeln!(out, "revoked token {id}")?),
                }
            }
            TokenCommand::Ls { .. } => {
                let tokens = store.tokens().await?;
                if json {
                    return output::json(out, &tokens);
                }
                for token in tokens {
                    let revoked = token
                        .revoked_at
                        .map_or(String::from("active"), |at| format!("revoked {}", utc(at)));
                    writeln!(
                        out,
                        "{}  {}  created {}  {revoked}",
                        token.id,
                        token.namespace,
                        utc(token.created_at)
                    )?;
                }
                Ok(())
            }
        }
    }
    .await;
    closed(store.as_ref(), result).await
}
