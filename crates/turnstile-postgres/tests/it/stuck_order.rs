//! The conformance case of `ls --stuck`'s order
//! (`turnstile_conformance::stuck_order`), with activity times set
//! through a connection of the test's own.

use sqlx::postgres::PgPoolOptions;
use turnstile_conformance::stuck_order::stuck_admissions_are_oldest_first_and_ties_go_by_conversation_id;
use turnstile_conformance::support::TestResult;
use turnstile_postgres::PostgresStore;
use turnstile_testkit::postgres::{database_url, fresh_options};

#[tokio::test]
async fn stuck_admissions_are_oldest_first_and_ties_go_by_conversation_id_on_postgres() -> TestResult
{
    let options = fresh_options();
    let schema = options.schema.clone().expect("a schema");
    let store = PostgresStore::connect_with(options).await?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url())
        .await?;
    stuck_admissions_are_oldest_first_and_ties_go_by_conversation_id(&store, |id, ms| {
        let (pool, schema) = (pool.clone(), schema.clone());
        async move {
            sqlx::query(&format!(
                "UPDATE {schema}.admissions SET updated_at = $1 WHERE conversation_id = $2"
            ))
            .bind(ms)
            .bind(id.as_uuid())
            .execute(&pool)
            .await?;
            Ok(())
        }
    })
    .await
}
