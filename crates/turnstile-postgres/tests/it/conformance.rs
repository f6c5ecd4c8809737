//! The store contract on a real PostgreSQL server.

use turnstile_postgres::PostgresStore;
use turnstile_testkit::postgres::fresh_store;

async fn store() -> (PostgresStore, ()) {
    (fresh_store().await, ())
}

turnstile_conformance::suite!(postgres, store());
