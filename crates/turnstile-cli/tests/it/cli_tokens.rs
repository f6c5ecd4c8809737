//! `token create|revoke|ls` and `serve --tokens`: a tenant's token is
//! printed once, admits its namespace, and admits nothing once revoked;
//! serving beyond loopback without tokens is refused.

use serde_json::json;

use crate::cli_support::{add_script, scripted, start_serve, turnstile, uuid};

#[tokio::test]
async fn a_token_admits_its_tenant_until_revoked_and_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tokens.db");
    let db_arg = db.to_str().unwrap();
    let created = turnstile(&["token", "create", "--db", db_arg, "--namespace", "alice"]);
    created.assert_success();
    let lines: Vec<&str> = created.stdout.lines().collect();
    let token = *lines.last().unwrap();
    assert!(token.starts_with("tst_"), "{lines:?}");
    let id = lines[0]
        .strip_prefix("token ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .to_owned();
    // Listed without its secret.
    let listed = turnstile(&["token", "ls", "--db", db_arg, "--json"]);
    listed.assert_success();
    assert!(!listed.stdout.contains(token));
    assert_eq!(listed.json()[0]["namespace"], "alice");
    assert_eq!(listed.json()[0]["id"], id.as_str());

    let model = scripted(&add_script(dir.path()));
    let (mut server, base) = start_serve(db.to_str().unwrap(), &model, &["--tokens"]);
    let client = reqwest::Client::new();
    let conversation = uuid();
    let post = |bearer: Option<&str>| {
        let request = client
            .post(format!("{base}/v1/conversations/{conversation}/requests"))
            .header("idempotency-key", uuid())
            .json(&json!({"input": "what is 2 + 3?"}));
        match bearer {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    };
    assert_eq!(post(None).send().await.unwrap().status().as_u16(), 401);
    assert_eq!(
        post(Some(token)).send().await.unwrap().status().as_u16(),
        200
    );

    turnstile(&["token", "revoke", &id, "--db", db_arg]).assert_success();
    assert_eq!(
        post(Some(token)).send().await.unwrap().status().as_u16(),
        401
    );
    turnstile(&["token", "revoke", &id, "--db", db_arg]).assert_error(4, "not found");
    server.kill().unwrap();
    server.wait().unwrap();
}

#[test]
fn serving_beyond_loopback_without_tokens_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("open.db");
    turnstile(&[
        "serve",
        "--db",
        db.to_str().unwrap(),
        "--listen",
        "0.0.0.0:0",
        "--model",
        &scripted(&add_script(dir.path())),
    ])
    .assert_error(2, "pass --tokens");
    assert!(!db.exists(), "nothing created");
}
