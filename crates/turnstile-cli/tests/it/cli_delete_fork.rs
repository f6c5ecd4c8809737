//! `turnstile delete` and `turnstile fork` on the built binary: exit codes
//! for a stale version, a held conversation, an unknown and a deleted one,
//! a cut inside a tool round; `--json` output; the database afterwards.

use std::path::Path;

use turnstile::store::ClaimOutcome;
use turnstile::{ConversationId, Namespace, Store};
use turnstile_conformance::support::new_request;

use crate::cli_support::{add_script, open, scripted, turnstile, uuid};

/// Commits one request with a tool round: 4 entries, version 1.
fn conversation_with_a_tool_round(dir: &Path, db: &Path) -> String {
    let conversation = uuid();
    let model = scripted(&add_script(dir));
    let run = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &model,
        "what is 2 + 3?",
    ]);
    run.assert_success();
    conversation
}

async fn entries(db: &Path, conversation: &str) -> usize {
    let store = open(db).await;
    let id: ConversationId = conversation.parse().unwrap();
    let n = store.transcript_window(id, 100).await.unwrap().len();
    turnstile::StoreAdmin::close(&store).await.unwrap();
    n
}

#[tokio::test]
async fn fork_prints_the_new_id_refuses_a_cut_inside_a_tool_round_and_leaves_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let source = conversation_with_a_tool_round(dir.path(), &db);
    let db_arg = db.to_str().unwrap();

    let run = turnstile(&["fork", &source, "--through", "2", "--db", db_arg]);
    run.assert_error(2, "tool round");
    let run = turnstile(&["fork", &source, "--through", "9", "--db", db_arg]);
    run.assert_error(2, "4 committed entries");
    let run = turnstile(&["fork", &uuid(), "--through", "1", "--db", db_arg]);
    run.assert_error(4, "not found");

    let run = turnstile(&["fork", &source, "--through", "4", "--db", db_arg, "--json"]);
    run.assert_success();
    let json = run.json();
    assert_eq!(json["entries"], 4);
    let fork = json["conversation_id"].as_str().unwrap().to_owned();
    assert_eq!(entries(&db, &fork).await, 4);

    let chosen = uuid();
    let run = turnstile(&[
        "fork",
        &source,
        "--through",
        "3",
        "--new-conversation",
        &chosen,
        "--db",
        db_arg,
    ]);
    run.assert_success();
    assert_eq!(run.stdout.trim(), chosen);
    assert_eq!(entries(&db, &chosen).await, 3);
    // The id is taken now.
    let run = turnstile(&[
        "fork",
        &source,
        "--through",
        "3",
        "--new-conversation",
        &chosen,
        "--db",
        db_arg,
    ]);
    run.assert_error(2, "exists");
    assert_eq!(entries(&db, &source).await, 4);
}

#[tokio::test]
async fn delete_exits_5_on_a_stale_version_3_while_held_4_when_unknown_or_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let conversation = conversation_with_a_tool_round(dir.path(), &db);
    let db_arg = db.to_str().unwrap();

    let run = turnstile(&["delete", &conversation, "--db", db_arg, "--version", "0"]);
    run.assert_error(5, "version 1");
    let run = turnstile(&["delete", &uuid(), "--db", db_arg, "--version", "0"]);
    run.assert_error(4, "not found");

    // A request holds it.
    let id: ConversationId = conversation.parse().unwrap();
    let (revision, held_request, held_run) = {
        let store = open(&db).await;
        let admission = store.admission(id).await.unwrap();
        let claim = new_request(id, admission.revision, "held");
        let ClaimOutcome::Admitted(fence) = store.claim(&claim).await.unwrap() else {
            panic!("not admitted");
        };
        turnstile::StoreAdmin::close(&store).await.unwrap();
        (fence.revision, fence.request_id, fence.run_id)
    };
    let run = turnstile(&["delete", &conversation, "--db", db_arg, "--version", "1"]);
    run.assert_error(3, "busy");
    let run = turnstile(&[
        "delete",
        &conversation,
        "--db",
        db_arg,
        "--version",
        "1",
        "--namespace",
        "other",
    ]);
    run.assert_error(2, "namespace");

    let revision = revision.0.to_string();
    let run = turnstile(&[
        "delete",
        &conversation,
        "--db",
        db_arg,
        "--version",
        "1",
        "--revision",
        &revision,
        "--json",
    ]);
    run.assert_success();
    let json = run.json();
    assert_eq!(json["conversation_id"], conversation.as_str());
    assert_eq!(json["deleted"]["requests"], 2);
    assert_eq!(json["deleted"]["transcript"], 4);
    assert_eq!(json["tombstoned_requests"], 2);

    let run = turnstile(&["delete", &conversation, "--db", db_arg, "--version", "1"]);
    run.assert_error(4, "was deleted");
    let store = open(&db).await;
    let deleted = store
        .ensure_conversation(&Namespace::new("default").unwrap(), id)
        .await;
    assert!(
        matches!(deleted, Err(turnstile::Error::Deleted { .. })),
        "{deleted:?}"
    );
    turnstile::StoreAdmin::close(&store).await.unwrap();

    // Its runs and request ids answer "deleted" everywhere: the checkpoints
    // of one of its runs, and a run of one of its request ids in another,
    // new conversation, which is not created.
    let run = turnstile(&["checkpoints", &held_run.to_string(), "--db", db_arg]);
    run.assert_error(4, "was deleted");
    let fresh = uuid();
    let run = turnstile(&[
        "run",
        "--db",
        db_arg,
        "--conversation",
        &fresh,
        "--request",
        &held_request.to_string(),
        "--model",
        &scripted(&add_script(dir.path())),
        "held",
    ]);
    run.assert_error(4, "was deleted");
    let store = open(&db).await;
    let created = store
        .conversation(&Namespace::new("default").unwrap(), fresh.parse().unwrap())
        .await;
    assert!(
        matches!(created, Err(turnstile::Error::NotFound { .. })),
        "{created:?}"
    );
}

#[test]
fn delete_prints_what_it_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let conversation = conversation_with_a_tool_round(dir.path(), &db);
    let run = turnstile(&[
        "delete",
        &conversation,
        "--db",
        db.to_str().unwrap(),
        "--version",
        "1",
    ]);
    run.assert_success();
    assert!(
        run.stdout
            .contains(&format!("deleted conversation {conversation}")),
        "{run:?}"
    );
    assert!(run.stdout.contains("transcript"), "{run:?}");
}
