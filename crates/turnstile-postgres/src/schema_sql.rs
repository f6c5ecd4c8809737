//! `schema.sql` beside this crate's `Cargo.toml` is the current schema, as
//! `pg_dump --schema-only` writes a freshly migrated database. This test
//! fails when the two drift apart; `TURNSTILE_BLESS_SCHEMA=1 cargo test -p
//! turnstile-postgres schema_sql` writes the file anew after a migration.

use std::path::Path;

use turnstile_test_postgres::Server;

use crate::PostgresStore;

#[tokio::test]
async fn schema_sql_matches_a_freshly_migrated_database() {
    let server = Server::shared();
    let (database, url) = server.fresh_database_named();
    let store = PostgresStore::connect(&url).await.unwrap();
    drop(store);
    let dumped = format!(
        "-- The current schema of a turnstile PostgreSQL database, as pg_dump writes a\n\
         -- freshly migrated one (written by the test `schema_sql`; do not edit by hand).\n\
         -- Migrations under migrations/ change it.\n{}\n",
        server.schema_dump(&database)
    );

    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema.sql");
    if std::env::var_os("TURNSTILE_BLESS_SCHEMA").is_some() {
        std::fs::write(&file, &dumped).unwrap();
    }
    let checked_in = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        checked_in == dumped,
        "{} differs from a freshly migrated database; if the migration is meant, write it \
         anew with TURNSTILE_BLESS_SCHEMA=1 cargo test -p turnstile-postgres --lib schema_sql \
         and review the diff",
        file.display()
    );
}
