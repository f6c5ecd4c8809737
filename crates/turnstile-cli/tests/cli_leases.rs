//! `ls … --stuck` and `doctor` on the built binary go by the lease when the
//! owner holds one: an expired lease is stuck however fresh the activity,
//! a live one is not however stale.

mod cli_support;

use std::path::Path;

use cli_support::{open, turnstile};
use serde_json::Value;
use turnstile::store::columns::now_ms;
use turnstile::store::{ClaimOutcome, Fence, InputHash, NewRequest};
use turnstile::{ConversationId, Message, Namespace, RequestId, RunId, Store};

fn ops(args: &[&str], db: &Path) -> Value {
    let mut all = args.to_vec();
    all.extend(["--db", db.to_str().unwrap(), "--json"]);
    let run = turnstile(&all);
    run.assert_success();
    run.json()
}

/// A request held in a conversation of its own, its lease at `expires_at`.
async fn leased(store: &dyn Store, expires_at: i64) -> Fence {
    let conversation = ConversationId::new();
    let namespace = Namespace::new("leases").unwrap();
    store
        .ensure_conversation(&namespace, conversation)
        .await
        .unwrap();
    let claim = NewRequest {
        conversation_id: conversation,
        request_id: RequestId::new(),
        input_sha256: InputHash::of("work"),
        input: Message::user("work"),
        expected_revision: store.admission(conversation).await.unwrap().revision,
        run_id: RunId::new(),
        agent_fingerprint: "fp".into(),
        first_turn: None,
        deadline_at: None,
    };
    let ClaimOutcome::Admitted(fence) = store.claim(&claim).await.unwrap() else {
        panic!("a fresh request is admitted");
    };
    store.renew_lease(&fence, expires_at).await.unwrap();
    fence
}

#[tokio::test]
async fn stuck_listings_and_doctor_go_by_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    let store = open(&db).await;
    let lapsed = leased(&store, now_ms() - 1).await;
    let live = leased(&store, now_ms() + 600_000).await;
    drop(store);

    let request_ids = |listed: &Value| -> Vec<String> {
        listed
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["request_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let lapsed_id = lapsed.request_id.to_string();
    // Patient (the default 5m) or impatient, only the lapsed lease is stuck.
    for stale in [&[][..], &["--stale-after", "0s"][..]] {
        let args = [&["ls", "requests", "--stuck"][..], stale].concat();
        let listed = ops(&args, &db);
        assert_eq!(request_ids(&listed), [lapsed_id.as_str()], "{stale:?}");
        assert_eq!(listed[0]["held"]["stuck"], true);
        assert!(listed[0]["held"]["lease_expires_at"].is_i64());
        let doctor = ops(&[&["doctor"][..], stale].concat(), &db);
        assert_eq!(
            (&doctor["held_admissions"], &doctor["stuck_admissions"]),
            (&Value::from(2), &Value::from(1))
        );
    }
    let all = ops(&["ls", "requests"], &db);
    let live_row = all
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["request_id"] == live.request_id.to_string())
        .expect("the live request is listed");
    assert_eq!(live_row["held"]["stuck"], false);
}
