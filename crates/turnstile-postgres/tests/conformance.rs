//! The store contract on a real PostgreSQL server.

mod support;

use turnstile_postgres::PostgresStore;

async fn store() -> (PostgresStore, ()) {
    (support::fresh_store().await, ())
}

turnstile_conformance::suite!(postgres, store());
