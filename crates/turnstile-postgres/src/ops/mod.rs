//! The operations contract ([`StoreAdmin`](turnstile_core::admin::StoreAdmin))
//! on PostgreSQL: listings, retention, health and storage figures.

mod doctor;
mod list;
mod page;
mod prune;
mod tokens;

use std::time::Duration;

use async_trait::async_trait;
use turnstile_core::admin::{
    ConversationPage, ConversationSummary, DoctorReport, ListFilter, NewToken, PruneOptions,
    PruneReport, RequestSummary, RunSummary, StorageReport, StoreAdmin, TokenRecord,
};
use turnstile_core::ids::{ConversationId, Namespace, RunId};
use turnstile_core::Error;

use super::codec::now_ms;
use super::PostgresStore;

#[async_trait]
impl StoreAdmin for PostgresStore {
    async fn list_conversations(&self, filter: &ListFilter) -> Result<ConversationPage, Error> {
        list::list_conversations(self, filter).await
    }

    async fn conversation_summary(
        &self,
        id: ConversationId,
        stale_after: Duration,
    ) -> Result<Option<ConversationSummary>, Error> {
        list::one_conversation(self, id, stale_after).await
    }

    async fn list_requests(&self, filter: &ListFilter) -> Result<Vec<RequestSummary>, Error> {
        list::list_requests(self, filter).await
    }

    async fn list_runs(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, Error> {
        list::list_runs(self, filter).await
    }

    async fn run_summary(
        &self,
        run_id: RunId,
        stale_after: Duration,
    ) -> Result<Option<RunSummary>, Error> {
        list::one_run(self, run_id, stale_after).await
    }

    async fn prune(&self, options: &PruneOptions) -> Result<PruneReport, Error> {
        // What a prune deletes leaves the process's memory with its rows.
        if !options.dry_run {
            self.claim_memory.clear();
        }
        prune::prune(self, options).await
    }

    async fn doctor(&self, stale_after: Duration) -> Result<DoctorReport, Error> {
        doctor::doctor(self, stale_after).await
    }

    async fn storage(&self) -> Result<StorageReport, Error> {
        doctor::storage(self).await
    }

    async fn close(&self) -> Result<(), Error> {
        PostgresStore::close(self).await;
        Ok(())
    }

    async fn store_token(&self, token: &NewToken) -> Result<(), Error> {
        crate::retry::autocommit!(self, |conn, _retry| tokens::store(conn, token))
    }

    async fn token_namespace(&self, sha256: &[u8; 32]) -> Result<Option<Namespace>, Error> {
        crate::retry::autocommit!(self, |conn, _retry| tokens::namespace(conn, sha256))
    }

    async fn revoke_token(&self, id: uuid::Uuid) -> Result<bool, Error> {
        crate::retry::autocommit!(self, |conn, retry| tokens::revoke(conn, id, retry))
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>, Error> {
        crate::retry::autocommit!(self, |conn, _retry| tokens::list(conn))
    }
}

/// Unix milliseconds `age` ago.
fn cutoff(age: Duration) -> i64 {
    now_ms().saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
}
