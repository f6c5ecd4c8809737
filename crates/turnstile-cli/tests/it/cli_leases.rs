//! Leases on the built binary: `ls … --stuck` and `doctor` go by the lease
//! when the owner holds one (an expired lease is stuck however fresh the
//! activity, a live one is not however stale); `run --lease` frozen past
//! its lease is taken over by `recover-expired` in another process.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use turnstile::store::{ClaimOutcome, Fence, RequestStatus};
use turnstile::{ConversationId, Message, Namespace, Store};
use turnstile_conformance::support::new_request;
use turnstile_core::backend::now_ms;
use turnstile_testkit::process;

use crate::cli_support::{add_script, command, open, script, scripted, turnstile, uuid};

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
    let revision = store.admission(conversation).await.unwrap().revision;
    let claim = new_request(conversation, revision, "work");
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
        let listed = ops(&args, &db)["requests"].clone();
        assert_eq!(request_ids(&listed), [lapsed_id.as_str()], "{stale:?}");
        assert_eq!(listed[0]["held"]["stuck"], true);
        assert!(listed[0]["held"]["lease_expires_at"].is_i64());
        let doctor = ops(&[&["doctor"][..], stale].concat(), &db);
        assert_eq!(
            (&doctor["held_admissions"], &doctor["stuck_admissions"]),
            (&Value::from(2), &Value::from(1))
        );
    }
    let all = ops(&["ls", "requests"], &db)["requests"].clone();
    let live_row = all
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["request_id"] == live.request_id.to_string())
        .expect("the live request is listed");
    assert_eq!(live_row["held"]["stuck"], false);
}

/// Turn 1 calls `add`; turn 2's answer takes two seconds (the window the
/// test freezes the owner in).
fn slow_second_turn(dir: &Path) -> std::path::PathBuf {
    script(
        dir,
        "slow-second.json",
        serde_json::json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}]},
            {"text": "2 + 3 = 5", "delay_ms": 2000}
        ]),
    )
}

const SHORT_LEASE: [&str; 4] = ["--lease-renew", "200ms", "--lease-expire", "600ms"];

/// `run --lease` frozen with SIGSTOP inside its second model call, past
/// its lease: `recover-expired` (another process) refuses the turn in
/// flight without `--retry-interrupted` (exit 5, the request left held)
/// and takes it over with it; woken with SIGCONT, the old owner is fenced
/// (exit 5) and the conversation holds the request once.
#[tokio::test]
async fn a_frozen_leased_run_is_taken_over_by_recover_expired_and_fenced_when_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("takeover.db");
    let db_arg = db.to_str().unwrap();
    let conversation = uuid();
    let request = uuid();
    let model = scripted(&slow_second_turn(dir.path()));
    let run_args = [
        &["run", "--db", db_arg, "--conversation", &conversation][..],
        &["--request", &request, "--model", &model, "--lease"][..],
        &SHORT_LEASE[..],
        &["what is 2 + 3?"][..],
    ]
    .concat();
    let mut owner = command(&run_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(owner.stdout.take().unwrap()).lines();
    let marker = "turn 2 · write-ahead checkpoint saved";
    let reached = lines
        .by_ref()
        .map(Result::unwrap)
        .any(|l| l.contains(marker));
    assert!(reached, "the owner reached its second model call");
    process::signal(&owner, "-STOP");
    // Past the lease of the last renewal before the freeze (600 ms).
    std::thread::sleep(Duration::from_millis(1_200));

    let recover = |retry: &[&str]| {
        let args = [
            &[
                "recover-expired",
                "--db",
                db_arg,
                "--model",
                &model,
                "--json",
            ][..],
            &SHORT_LEASE[..],
            retry,
        ]
        .concat();
        turnstile(&args)
    };
    let refused = recover(&[]);
    assert_eq!(refused.code, 5, "{refused:#?}");
    assert!(
        refused.stderr.starts_with("error: 1 of 1 expired requests"),
        "{refused:#?}"
    );
    let report = refused.json();
    assert_eq!(report["requests"][0]["request_id"], request.as_str());
    assert_eq!(report["requests"][0]["status"], "failed");
    assert_eq!(report["requests"][0]["exit_code"], 5);

    let taken = recover(&["--retry-interrupted"]);
    taken.assert_success();
    let report = taken.json();
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{report}");
    assert_eq!(requests[0]["status"], "completed");
    assert_eq!(requests[0]["conversation_id"], conversation.as_str());
    assert_eq!(requests[0]["outcome"]["final_text"], "2 + 3 = 5");

    process::signal(&owner, "-CONT");
    let mut stderr = String::new();
    owner
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = owner.wait().unwrap();
    assert_eq!(status.code(), Some(5), "fenced: {stderr}");
    assert!(stderr.contains("fenced"), "{stderr}");

    let store = open(&db).await;
    let record = store
        .request(request.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
    let conversation: ConversationId = conversation.parse().unwrap();
    let transcript = store
        .transcript_range(conversation, 0, u64::MAX)
        .await
        .unwrap();
    let count = |message: &Message| transcript.iter().filter(|e| &e.message == message).count();
    assert_eq!(count(&Message::user("what is 2 + 3?")), 1);
    assert_eq!(count(&Message::assistant("2 + 3 = 5")), 1);
    assert_eq!(
        transcript.len(),
        4,
        "input, call, result, answer: {transcript:#?}"
    );
    assert_eq!(store.admission(conversation).await.unwrap().active, None);
    assert!(store.expired_leases(10).await.unwrap().is_empty());

    // Nothing left to take over: exit 0, an empty report.
    let idle = recover(&[]);
    idle.assert_success();
    assert_eq!(idle.json(), serde_json::json!({"requests": []}));
    let human = turnstile(&["recover-expired", "--db", db_arg, "--model", &model]);
    human.assert_success();
    assert_eq!(human.stdout, "no expired leases\n");
}

/// Lease flags are checked before the database is opened: a timing without
/// `--lease`, or a lease that expires before it is renewed, exits 2 and
/// creates nothing.
#[test]
fn bad_lease_flags_are_usage_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let db_arg = db.to_str().unwrap();
    let model = scripted(&add_script(dir.path()));
    let conversation = uuid();
    let base = [
        "run",
        "--db",
        db_arg,
        "--conversation",
        &conversation,
        "--model",
        &model,
    ];
    let cases: [(&[&str], &str); 3] = [
        (&["--lease-renew", "1s", "hi"], "need --lease"),
        (
            &[
                "--lease",
                "--lease-renew",
                "5s",
                "--lease-expire",
                "5s",
                "hi",
            ],
            "renewed more often",
        ),
        (
            &["--lease", "--lease-expire", "0s", "hi"],
            "renewed more often",
        ),
    ];
    for (extra, message) in cases {
        turnstile(&[&base[..], extra].concat()).assert_error(2, message);
    }
    let expired = ["recover-expired", "--db", db_arg, "--model", &model];
    turnstile(
        &[
            &expired[..],
            &["--lease-renew", "1m", "--lease-expire", "1s"],
        ]
        .concat(),
    )
    .assert_error(2, "renewed more often");
    turnstile(&expired).assert_error(4, "not found");
    assert!(!db.exists());
}
