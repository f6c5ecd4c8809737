//! Connecting: the schema check refuses a newer schema without touching it,
//! a look-only connection changes nothing, bad options are typed errors,
//! and no password is ever printed.

use std::time::{Duration, Instant};

use sqlx::Connection;
use turnstile::{Error, PostgresOptions, PostgresStore, Store};
use turnstile_testkit::postgres::{database_url, fresh_options, fresh_schema};

/// A plain connection to the test database, in `schema`.
async fn raw(schema: &str) -> sqlx::PgConnection {
    let mut conn = sqlx::PgConnection::connect(database_url())
        .await
        .expect("connect");
    sqlx::query(&format!("SET search_path TO {schema}"))
        .execute(&mut conn)
        .await
        .expect("search path");
    conn
}

async fn count(conn: &mut sqlx::PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(conn)
        .await
        .expect("count")
}

#[tokio::test]
async fn a_newer_schema_is_refused_and_left_as_it_was() {
    let options = fresh_options();
    let schema = options.schema.clone().expect("schema");
    let store = PostgresStore::connect_with(options.clone())
        .await
        .expect("connect");
    store
        .ensure_conversation(
            &turnstile::Namespace::new("ns").expect("ns"),
            turnstile::ConversationId::new(),
        )
        .await
        .expect("conversation");
    store.close().await;
    let mut conn = raw(&schema).await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (9999, 'from the future', true, '\\x00', 0)",
    )
    .execute(&mut conn)
    .await
    .expect("a newer migration");
    let newer = PostgresStore::connect_with(options).await;
    assert!(
        matches!(newer, Err(Error::SchemaTooNew { found: 9999, supported }) if supported == PostgresStore::supported_schema_version()),
        "{newer:?}"
    );
    // This build's migrations and the one from the future: nothing ran.
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .expect("the migrations")
        .count();
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM _sqlx_migrations").await,
        i64::try_from(migrations).unwrap() + 1
    );
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM conversations").await,
        1
    );
}

#[tokio::test]
async fn looking_at_a_database_without_the_schema_is_not_found_and_creates_nothing() {
    let options = PostgresOptions {
        existing_only: true,
        ..fresh_options()
    };
    let schema = options.schema.clone().expect("schema");
    let missing = PostgresStore::connect_with(options.clone()).await;
    assert!(
        matches!(missing, Err(Error::NotFound { .. })),
        "{missing:?}"
    );
    let mut conn = raw("public").await;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(&schema)
            .fetch_one(&mut conn)
            .await
            .expect("query");
    assert!(!exists, "a look-only connection created the schema");

    // Once the schema exists, the same options connect.
    PostgresStore::connect_with(PostgresOptions {
        existing_only: false,
        ..options.clone()
    })
    .await
    .expect("create");
    PostgresStore::connect_with(options).await.expect("look");
}

#[tokio::test]
async fn bad_options_are_invalid_input() {
    for schema in [
        "",
        "Upper",
        "1st",
        "a-b",
        "x\"; DROP SCHEMA public; --",
        &"s".repeat(64),
    ] {
        let result = PostgresStore::connect_with(PostgresOptions {
            schema: Some(schema.to_owned()),
            ..PostgresOptions::new(database_url())
        })
        .await;
        assert!(
            matches!(result, Err(Error::InvalidInput(_))),
            "{schema:?}: {result:?}"
        );
    }
    for url in [
        "postgres://[::1",
        "postgres://host:notaport/db",
        "mysql://x",
    ] {
        let result = PostgresStore::connect(url).await;
        assert!(
            matches!(result, Err(Error::InvalidInput(_))),
            "{url}: {result:?}"
        );
    }
}

#[tokio::test]
async fn a_server_that_cannot_be_reached_is_a_store_error_not_busy() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let started = Instant::now();
    let result = PostgresStore::connect_with(PostgresOptions {
        acquire_timeout: Duration::from_secs(2),
        ..PostgresOptions::new(format!(
            "postgres://nobody:secret-password@127.0.0.1:{port}/db"
        ))
    })
    .await;
    let err = result.expect_err("nothing listens there");
    assert!(
        matches!(&err, Error::Store(e) if !e.is_busy() && e.message().starts_with("connect")),
        "{err:?}"
    );
    assert!(
        matches!(&err, Error::Store(e) if e.is_unreachable()),
        "a server that is not there is unreachable: {err:?}"
    );
    assert!(
        !format!("{err} {err:?}").contains("secret-password"),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn no_password_is_printed_by_the_options_or_the_store() {
    let options = PostgresOptions::new("postgres://app:hunter2-secret@127.0.0.1:5432/db");
    assert!(!format!("{options:?}").contains("hunter2"), "{options:?}");
    // The test server trusts every connection: the password is accepted
    // unchecked, and must show nowhere.
    let url = database_url().replacen("://turnstile@", "://turnstile:hunter2-secret@", 1);
    assert!(url.contains("hunter2-secret"), "{url}");
    let store = PostgresStore::connect_with(PostgresOptions {
        schema: Some(fresh_schema()),
        ..PostgresOptions::new(url)
    })
    .await
    .expect("connect");
    assert!(
        store
            .location()
            .starts_with("postgres://turnstile@127.0.0.1:"),
        "{}",
        store.location()
    );
    for shown in [store.location().to_owned(), format!("{store:?}")] {
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}

/// `connect_with` on `url` with a short wait and `existing_only` as given.
async fn connect_to(url: &str, existing_only: bool) -> Result<PostgresStore, Error> {
    PostgresStore::connect_with(PostgresOptions {
        acquire_timeout: Duration::from_secs(5),
        existing_only,
        ..PostgresOptions::new(url)
    })
    .await
}

#[tokio::test]
async fn a_missing_server_database_and_schema_are_three_typed_errors() {
    let server = turnstile_test_postgres::Server::start_own();
    let (name, url) = server.fresh_database_named();

    // The database is there without turnstile's tables: a look-only
    // connection finds no schema.
    let no_schema = connect_to(&url, true).await;
    assert!(
        matches!(
            &no_schema,
            Err(Error::NotFound {
                what: "turnstile schema",
                ..
            })
        ),
        "{no_schema:?}"
    );

    // A database the server does not have: not found as a database, for a
    // look-only and a writing connection alike, and nothing is created.
    let missing_url = url.replacen(&format!("/{name}"), "/no_such_database", 1);
    for existing_only in [true, false] {
        let missing = connect_to(&missing_url, existing_only).await;
        assert!(
            matches!(&missing, Err(Error::NotFound { what: "database", id })
                if id.ends_with("/no_such_database") && id.starts_with("postgres://turnstile@")),
            "{missing:?}"
        );
    }
    assert_eq!(
        server.psql(
            "postgres",
            "SELECT COUNT(*) FROM pg_database WHERE datname = 'no_such_database'"
        ),
        "0"
    );

    // With the schema written, the same look-only connection succeeds.
    connect_to(&url, false).await.expect("create").close().await;
    connect_to(&url, true).await.expect("look").close().await;

    // The server stopped: unreachable, neither busy nor not found.
    server.stop_immediate();
    let gone = connect_to(&url, true).await;
    assert!(
        matches!(&gone, Err(Error::Store(e))
            if e.is_unreachable() && !e.is_busy() && e.message().starts_with("connect: ")),
        "{gone:?}"
    );
}

#[test]
fn the_location_is_read_from_the_options_without_connecting() {
    let options = PostgresOptions::new("postgres://me:pw@db.example:6543/app");
    assert_eq!(
        options.location().expect("a valid URL"),
        "postgres://me@db.example:6543/app"
    );
    let upper = PostgresOptions::new("POSTGRESQL://me@db.example/app");
    assert_eq!(
        upper.location().expect("the scheme in any case"),
        "postgres://me@db.example:5432/app"
    );
    for url in ["mysql://x", "postgres://host:notaport/db"] {
        let refused = PostgresOptions::new(url).location();
        assert!(
            matches!(&refused, Err(Error::InvalidInput(_))),
            "{url}: {refused:?}"
        );
    }
}
