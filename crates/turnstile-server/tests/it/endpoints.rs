//! The routes beside requests and events, over real HTTP: conversations
//! listed and shown, transcripts paged, metadata changed by its version,
//! approvals decided (the request then continues by itself), a stopped
//! request continued or abandoned, a conversation forked and deleted.

use serde_json::{json, Value};
use turnstile::{Agent, ConversationId, RequestId};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::CountingTool;

use crate::support::{start, store_in, Running};

fn conversation_path(id: &str) -> String {
    format!("/v1/conversations/{id}")
}

/// An agent whose `deploy` waits for approval: each request asks for it,
/// then answers `deployed`.
fn gated(deploy: std::sync::Arc<CountingTool>, requests: usize) -> Agent {
    let replies = (0..requests)
        .flat_map(|_| {
            [
                tools_reply(vec![call("d1", "deploy")], usage(3, 1)),
                text_reply("deployed", usage(4, 2)),
            ]
        })
        .collect();
    Agent::new(scripted(replies)).with_tool_requiring_approval(deploy)
}

/// Posts `input` under a new key, which must stop for approval: the key
/// and the revision the stop left.
async fn stopped_for_approval(server: &Running, conversation: &str) -> (String, u64) {
    let key = RequestId::new().to_string();
    let (status, stop) = server.post(conversation, &key, "deploy it").await;
    assert_eq!(status, 409, "{stop}");
    assert_eq!(stop["error"]["kind"], "awaiting_approval");
    assert_eq!(stop["error"]["ids"]["request_id"], key);
    let (status, pending) = server
        .get(&format!("{}/approvals", conversation_path(conversation)))
        .await;
    assert_eq!(status, 200, "{pending}");
    let approvals = pending["approvals"].as_array().unwrap();
    assert_eq!(approvals.len(), 1, "{pending}");
    assert_eq!(approvals[0]["request_id"], key);
    assert_eq!(approvals[0]["tool"], "deploy");
    // The stop names the revision a decision takes.
    assert_eq!(stop["error"]["ids"]["revision"], approvals[0]["revision"]);
    (key, approvals[0]["revision"].as_u64().unwrap())
}

/// Reads `conversation`'s event stream until its `committed` or
/// `abandoned` event: the kinds read.
async fn until_released(server: &Running, conversation: &str) -> Vec<String> {
    let mut reader = server.follow(conversation, 0).await;
    let mut kinds = Vec::new();
    loop {
        let event = reader.next().await;
        let done = matches!(event.kind.as_str(), "committed" | "abandoned");
        kinds.push(event.kind);
        if done && kinds.iter().filter(|k| *k == "admitted").count() == 1 {
            return kinds;
        }
    }
}

#[tokio::test]
async fn conversations_are_listed_shown_and_read_a_page_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let replies = (0..3)
        .map(|i| text_reply(&format!("answer {i}"), usage(1, 1)))
        .collect();
    let server = start(store, agent(scripted(replies), vec![])).await;
    let (first, second) = (
        ConversationId::new().to_string(),
        ConversationId::new().to_string(),
    );
    let mut answers = Vec::new();
    for (conversation, input) in [(&first, "one"), (&first, "two"), (&second, "three")] {
        let (status, body) = server
            .post(conversation, &RequestId::new().to_string(), input)
            .await;
        assert_eq!(status, 200, "{body}");
        answers.push(body["final_text"].clone());
    }

    let (status, page) = server.get("/v1/conversations?limit=1").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["conversations"][0]["conversation_id"], second);
    let cursor = page["next"].as_str().expect("a next page").to_owned();
    let (_, rest) = server
        .get(&format!("/v1/conversations?limit=1&after={cursor}"))
        .await;
    assert_eq!(rest["conversations"][0]["conversation_id"], first);
    assert_eq!(rest["next"], Value::Null);

    let (status, shown) = server.get(&conversation_path(&first)).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(
        (&shown["version"], &shown["transcript_entries"]),
        (&json!(2), &json!(4))
    );
    assert_eq!(shown["held"], Value::Null);

    let transcript = format!("{}/transcript", conversation_path(&first));
    let (status, head) = server.get(&format!("{transcript}?limit=3")).await;
    assert_eq!(status, 200, "{head}");
    let seqs = |page: &Value| -> Vec<u64> {
        page["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(seqs(&head), [0, 1, 2]);
    assert_eq!(head["entries"][0]["message"]["content"], "one");
    assert_eq!(head["next"], 3);
    let (_, tail) = server.get(&format!("{transcript}?from=3")).await;
    assert_eq!(seqs(&tail), [3]);
    assert_eq!(tail["entries"][0]["message"]["content"], answers[1]);
    assert_eq!(tail["next"], Value::Null);

    for bad in [
        "/v1/conversations?limit=0",
        "/v1/conversations?limit=501",
        "/v1/conversations?after=nonsense",
        "/v1/conversations?colour=red",
    ] {
        let (status, body) = server.get(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, body) = server
        .get(&conversation_path(&ConversationId::new().to_string()))
        .await;
    assert_eq!((status, &body["error"]["kind"]), (404, &json!("not_found")));
}

#[tokio::test]
async fn metadata_changes_by_its_version_and_a_stale_one_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let server = start(store, agent(scripted(vec![]), vec![])).await;
    let conversation = ConversationId::new().to_string();
    let metadata = format!("{}/metadata", conversation_path(&conversation));

    // Version 0 creates the conversation with its metadata.
    let (status, set) = server
        .send(
            "PUT",
            &metadata,
            json!({"meta_version": 0, "title": "Trip", "owner": "ada", "set": {"tier": "gold"}}),
        )
        .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["meta_version"], 1);
    assert_eq!(set["metadata"], json!({"tier": "gold"}));

    let (status, stale) = server
        .send(
            "PUT",
            &metadata,
            json!({"meta_version": 0, "title": "Other"}),
        )
        .await;
    assert_eq!(status, 409, "{stale}");
    assert_eq!(stale["error"]["kind"], "meta_version_conflict");
    // An absent title is kept; null clears the owner.
    let (status, cleared) = server
        .send(
            "PUT",
            &metadata,
            json!({"meta_version": 1, "owner": null, "unset": ["tier"]}),
        )
        .await;
    assert_eq!(status, 200, "{cleared}");
    let (_, read) = server.get(&metadata).await;
    assert_eq!(read, cleared);
    assert_eq!(
        (&read["title"], &read["owner"], &read["metadata"]),
        (&json!("Trip"), &Value::Null, &json!({}))
    );
    let (status, body) = server
        .send(
            "PUT",
            &metadata,
            json!({"meta_version": 2, "colour": "red"}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let (_, unchanged) = server.get(&metadata).await;
    assert_eq!(unchanged, cleared, "a refused change wrote nothing");
}

#[tokio::test]
async fn the_last_decision_continues_the_request_and_a_stale_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let deploy = CountingTool::new("deploy");
    let server = start(store, gated(deploy.clone(), 1)).await;
    let conversation = ConversationId::new().to_string();
    let (key, revision) = stopped_for_approval(&server, &conversation).await;
    let approvals = format!("{}/approvals", conversation_path(&conversation));
    let decision = |revision: u64| json!({"request_id": key, "call_id": "d1", "revision": revision, "decision": "approve"});

    let (status, stale) = server
        .send("POST", &approvals, decision(revision + 7))
        .await;
    assert_eq!(status, 409, "{stale}");
    assert_eq!(stale["error"]["kind"], "revision_conflict");
    assert_eq!(stale["error"]["ids"], json!({"revision": revision}));
    let (status, decided) = server.send("POST", &approvals, decision(revision)).await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["continued"], true);
    assert_eq!(decided["revision"], revision + 1);
    let (status, again) = server
        .send("POST", &approvals, decision(revision + 1))
        .await;
    assert_eq!(status, 409, "{again}");

    let kinds = until_released(&server, &conversation).await;
    assert_eq!(kinds.last().unwrap(), "committed", "{kinds:?}");
    assert!(kinds.contains(&"approval_decided".to_owned()), "{kinds:?}");
    assert_eq!(deploy.calls(), 1);
    let (status, replayed) = server.post(&conversation, &key, "deploy it").await;
    assert_eq!(status, 200, "{replayed}");
    assert_eq!(
        (&replayed["final_text"], &replayed["replayed"]),
        (&json!("deployed"), &json!(true))
    );
}

#[tokio::test]
async fn a_stopped_request_is_continued_or_abandoned_by_its_revision() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let deploy = CountingTool::new("deploy");
    let server = start(store, gated(deploy.clone(), 2)).await;
    let conversation = ConversationId::new().to_string();
    let path = conversation_path(&conversation);

    // Rejected with a reason, then continued explicitly: the model hears
    // the reason and answers; the tool never ran.
    let (key, revision) = stopped_for_approval(&server, &conversation).await;
    let (status, early) = server
        .send(
            "POST",
            &format!("{path}/requests/{key}/continue"),
            json!({"revision": revision}),
        )
        .await;
    assert_eq!(status, 409, "{early}");
    assert_eq!(early["error"]["kind"], "awaiting_approval");
    let (status, decided) = server
        .send(
            "POST",
            &format!("{path}/approvals"),
            json!({"request_id": key, "call_id": "d1", "revision": revision,
                   "decision": "reject", "reason": "not on a Friday"}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(
        until_released(&server, &conversation).await.last().unwrap(),
        "committed"
    );
    assert_eq!(deploy.calls(), 0);

    // The next one is abandoned: its key is burned.
    let (key, revision) = stopped_for_approval(&server, &conversation).await;
    let abandon = format!("{path}/requests/{key}/abandon");
    let (status, stale) = server
        .send("POST", &abandon, json!({"revision": revision + 1}))
        .await;
    assert_eq!(status, 409, "{stale}");
    let (status, moved) = server
        .send("POST", &abandon, json!({"revision": revision}))
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["revision"], revision + 1);
    let (status, burned) = server.post(&conversation, &key, "deploy it").await;
    assert_eq!(status, 409, "{burned}");
    assert_eq!(burned["error"]["kind"], "abandoned");
    let (status, gone) = server
        .send(
            "POST",
            &format!("{path}/requests/{}/abandon", RequestId::new()),
            json!({"revision": revision + 1}),
        )
        .await;
    assert_eq!(
        (status, &gone["error"]["message"]),
        (404, &json!("no such request"))
    );
}

#[tokio::test]
async fn a_fork_copies_committed_entries_and_a_delete_needs_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let replies = (0..2)
        .map(|i| text_reply(&format!("answer {i}"), usage(1, 1)))
        .collect();
    let server = start(store, agent(scripted(replies), vec![])).await;
    let conversation = ConversationId::new().to_string();
    for input in ["one", "two"] {
        let (status, body) = server
            .post(&conversation, &RequestId::new().to_string(), input)
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let path = conversation_path(&conversation);

    let (status, forked) = server
        .send("POST", &format!("{path}/fork"), json!({"through": 2}))
        .await;
    assert_eq!(status, 201, "{forked}");
    assert_eq!(forked["entries"], 2);
    let fork_id = forked["conversation_id"].as_str().unwrap().to_owned();
    let (_, fork) = server
        .get(&format!("{}/transcript", conversation_path(&fork_id)))
        .await;
    assert_eq!(fork["entries"].as_array().unwrap().len(), 2);
    let (status, cut) = server
        .send("POST", &format!("{path}/fork"), json!({"through": 9}))
        .await;
    assert_eq!(
        (status, &cut["error"]["kind"]),
        (400, &json!("invalid_input"))
    );

    let delete = |version: u64| {
        server
            .client
            .delete(server.url(&format!("{path}?version={version}")))
    };
    let (status, stale) = crate::support::answer(delete(1)).await;
    assert_eq!(status, 409, "{stale}");
    assert_eq!(stale["error"]["kind"], "version_conflict");
    let (status, unversioned) = server.send("DELETE", &path, json!({})).await;
    assert_eq!(status, 400, "{unversioned}");
    let (status, deleted) = crate::support::answer(delete(2)).await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["conversation_id"], conversation);
    let (status, _) = server.get(&path).await;
    assert_eq!(status, 404);
    let (status, again) = server
        .post(&conversation, &RequestId::new().to_string(), "three")
        .await;
    assert_eq!((status, &again["error"]["kind"]), (410, &json!("deleted")));
    let (status, _) = server.get(&conversation_path(&fork_id)).await;
    assert_eq!(status, 200, "the fork outlives its source");
}

#[tokio::test]
async fn files_sent_with_the_input_are_stored_as_its_parts_and_bad_ones_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let replies = vec![text_reply("seen", usage(1, 1))];
    let server = crate::support::start_server(
        turnstile_server::Server::new(store.clone(), agent(scripted(replies), vec![]), ns())
            .with_attachment_limit(64),
    )
    .await;
    let conversation = ConversationId::new().to_string();
    let post = |attachments: Value| {
        server
            .client
            .post(server.requests(&conversation))
            .header("idempotency-key", RequestId::new().to_string())
            .json(&json!({"input": "what is in these?", "attachments": attachments}))
    };
    use base64::Engine;
    let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);

    for (attachments, status, kind) in [
        (
            json!([{"media_type": "image/png", "data": "not base64!"}]),
            400,
            "invalid_body",
        ),
        (
            json!([{"media_type": "image/png", "data": encode(&[7; 65])}]),
            413,
            "too_large",
        ),
        (
            json!([{"media_type": "", "data": encode(b"x")}]),
            400,
            "invalid_input",
        ),
        (
            json!([{"media_type": "image/png", "data": "", "colour": 1}]),
            422,
            "invalid_body",
        ),
        (
            json!([{"media_type": "image/png", "data": ""}]),
            400,
            "invalid_body",
        ),
        (
            json!(vec![
                json!({"media_type": "image/png", "data": encode(b"x")});
                33
            ]),
            413,
            "too_large",
        ),
    ] {
        let (got, body) = crate::support::answer(post(attachments.clone())).await;
        assert_eq!(
            (got, &body["error"]["kind"]),
            (status, &json!(kind)),
            "{attachments}: {body}"
        );
    }
    let id: ConversationId = conversation.parse().unwrap();
    assert!(
        store.conversation(&ns(), id).await.is_err(),
        "nothing was written"
    );

    let png = [0x89, b'P', b'N', b'G', 1, 2, 3];
    let attachments = json!([
        {"media_type": "image/png", "data": encode(&png)},
        {"media_type": "text/csv", "name": "sums.csv", "data": encode(b"a,b\n2,3\n")},
    ]);
    let (status, outcome) = crate::support::answer(post(attachments)).await;
    assert_eq!(status, 200, "{outcome}");
    let (_, transcript) = server
        .get(&format!("{}/transcript", conversation_path(&conversation)))
        .await;
    let parts = &transcript["entries"][0]["message"]["content"];
    assert_eq!(
        parts[0],
        json!({"type": "text", "text": "what is in these?"})
    );
    assert_eq!(parts[1]["type"], "image");
    assert_eq!(parts[1]["size"], png.len());
    assert_eq!(
        (
            &parts[2]["type"],
            &parts[2]["name"],
            &parts[2]["media_type"]
        ),
        (&json!("file"), &json!("sums.csv"), &json!("text/csv"))
    );
    let stored = store
        .blob(turnstile::BlobHash::from_hex(parts[1]["sha256"].as_str().unwrap()).unwrap())
        .await
        .unwrap()
        .expect("the image's bytes are stored");
    assert_eq!(&*stored, &png);
}
