//! The operations contract ([`StoreAdmin`](turnstile_core::admin::StoreAdmin))
//! on SQLite: listings (`ls`, `show`), retention (`prune`), health
//! (`doctor`) and storage figures.

mod doctor;
mod list;
mod page;
mod prune;
mod storage;
mod tokens;

pub(crate) use prune::reclaim;

use std::time::Duration;

use async_trait::async_trait;
use turnstile_core::admin::{
    ConversationPage, ConversationSummary, DoctorReport, ListFilter, NewToken, PruneOptions,
    PruneReport, RequestSummary, RunSummary, StorageReport, StoreAdmin, TokenRecord,
};
use turnstile_core::ids::{ConversationId, Namespace, RunId};
use turnstile_core::Error;

use super::codec::now_ms;
use super::SqliteStore;

#[async_trait]
impl StoreAdmin for SqliteStore {
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
        doctor::of_store(self, stale_after).await
    }

    async fn storage(&self) -> Result<StorageReport, Error> {
        storage::storage(self).await
    }

    async fn close(&self) -> Result<(), Error> {
        SqliteStore::close(self).await
    }

    async fn store_token(&self, token: &NewToken) -> Result<(), Error> {
        tokens::store(self, token).await
    }

    async fn token_namespace(&self, sha256: &[u8; 32]) -> Result<Option<Namespace>, Error> {
        tokens::namespace(self, sha256).await
    }

    async fn revoke_token(&self, id: uuid::Uuid) -> Result<bool, Error> {
        tokens::revoke(self, id).await
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>, Error> {
        tokens::list(self).await
    }
}

/// Unix milliseconds `age` ago.
fn cutoff(age: Duration) -> i64 {
    now_ms().saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
}
