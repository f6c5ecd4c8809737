//! Tenants: each token sees its own namespace only; no token, an unknown
//! one or a revoked one is 401 and writes nothing.

use std::time::Duration;

use reqwest::RequestBuilder;
use serde_json::{json, Value};
use turnstile::{ConversationId, Namespace, RequestId};
use turnstile_testkit::session::*;

use crate::support::{start_with_tokens, store_in, Running};

async fn answer(request: RequestBuilder) -> (u16, Value) {
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let www = response.headers().get("www-authenticate").cloned();
    let body: Value = response.json().await.expect("a JSON answer");
    if status == 401 {
        assert_eq!(www.as_ref().and_then(|v| v.to_str().ok()), Some("Bearer"));
    }
    (status, body)
}

/// `request`, with `token` as its bearer when there is one.
fn with_token(request: RequestBuilder, token: Option<&str>) -> RequestBuilder {
    match token {
        Some(token) => request.bearer_auth(token),
        None => request,
    }
}

fn post(server: &Running, conversation: &str, token: Option<&str>, input: &str) -> RequestBuilder {
    let request = server
        .client
        .post(server.requests(conversation))
        .header("idempotency-key", RequestId::new().to_string())
        .json(&json!({ "input": input }));
    with_token(request, token)
}

fn events(server: &Running, conversation: &str, token: Option<&str>) -> RequestBuilder {
    let request = server.client.get(server.events(conversation));
    with_token(request, token)
}

#[tokio::test]
async fn each_token_sees_its_namespace_only_and_no_token_or_a_revoked_one_is_401() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let alice = store
        .create_token(&Namespace::new("alice").unwrap())
        .await
        .unwrap();
    let bob = store
        .create_token(&Namespace::new("bob").unwrap())
        .await
        .unwrap();
    let replies = (0..3)
        .map(|i| text_reply(&format!("answer {i}"), usage(1, 1)))
        .collect();
    let server = start_with_tokens(store.clone(), agent(scripted(replies), vec![])).await;
    let conversation = ConversationId::new().to_string();
    let missing = ConversationId::new().to_string();

    let (status, done) = answer(post(&server, &conversation, Some(&alice.token), "hi")).await;
    assert_eq!(status, 200, "{done}");

    // Bob: Alice's conversation answers exactly as one that does not exist.
    let (status, theirs) = answer(post(&server, &conversation, Some(&bob.token), "hi")).await;
    let (status_missing, none) = answer(events(&server, &missing, Some(&bob.token))).await;
    assert_eq!((status, status_missing), (404, 404));
    let (status, their_events) = answer(events(&server, &conversation, Some(&bob.token))).await;
    assert_eq!(status, 404);
    assert_eq!(theirs, none, "no ids or details of another tenant");
    assert_eq!(their_events, none);
    assert!(!theirs.to_string().contains(&conversation));

    // No token, a malformed header, a token nobody was given: 401.
    let strangers = [
        post(&server, &conversation, None, "hi"),
        events(&server, &conversation, None),
        post(&server, &conversation, Some("tst_nobody"), "hi"),
        events(&server, &conversation, Some("tst_nobody")),
        server
            .client
            .get(server.events(&conversation))
            .header("authorization", alice.token.clone()),
    ];
    for request in strangers {
        let (status, body) = answer(request).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["error"]["kind"], "unauthorized");
    }

    // Revoked: Alice's token admits nothing more, and her open stream ends.
    let mut open = events(&server, &conversation, Some(&alice.token))
        .send()
        .await
        .unwrap();
    assert_eq!(open.status().as_u16(), 200);
    assert!(store.revoke_token(alice.id).await.unwrap());
    let mut ended = false;
    while let Ok(chunk) = tokio::time::timeout(Duration::from_secs(10), open.chunk()).await {
        if !matches!(chunk, Ok(Some(_))) {
            ended = true;
            break;
        }
    }
    assert!(ended, "the stream of a revoked token ends");
    let (status, _) = answer(post(&server, &conversation, Some(&alice.token), "again")).await;
    assert_eq!(status, 401);
    let (status, _) = answer(events(&server, &conversation, Some(&alice.token))).await;
    assert_eq!(status, 401);

    // Nothing of those was written: Alice's conversation has its one request.
    let id: ConversationId = conversation.parse().unwrap();
    let alice_ns = Namespace::new("alice").unwrap();
    assert_eq!(store.conversation(&alice_ns, id).await.unwrap().version, 1);
    assert_eq!(store.events_after(id, 0, 100).await.unwrap().len(), 2);
    let bob_ns = Namespace::new("bob").unwrap();
    assert!(store.conversation(&bob_ns, id).await.is_err());
    // Bob's own conversation works.
    let (status, _) = answer(post(&server, &missing, Some(&bob.token), "mine")).await;
    assert_eq!(status, 200);
}

/// Every route but the listing, for `conversation` and `request`: method,
/// path and JSON body.
fn routes(conversation: &str, request: &str) -> Vec<(&'static str, String, Value)> {
    let c = format!("/v1/conversations/{conversation}");
    let r = format!("{c}/requests/{request}");
    vec![
        ("GET", c.clone(), json!(null)),
        ("DELETE", format!("{c}?version=1"), json!(null)),
        ("POST", format!("{c}/fork"), json!({"through": 2})),
        ("POST", format!("{c}/requests"), json!({"input": "hi"})),
        ("POST", format!("{r}/continue"), json!({"revision": 1})),
        ("POST", format!("{r}/abandon"), json!({"revision": 1})),
        ("GET", format!("{c}/events"), json!(null)),
        ("GET", format!("{c}/transcript"), json!(null)),
        ("GET", format!("{c}/metadata"), json!(null)),
        (
            "PUT",
            format!("{c}/metadata"),
            json!({"meta_version": 0, "title": "mine"}),
        ),
        ("GET", format!("{c}/approvals"), json!(null)),
        (
            "POST",
            format!("{c}/approvals"),
            json!({"request_id": request, "call_id": "c1", "revision": 1, "decision": "approve"}),
        ),
    ]
}

fn call_route(
    server: &Running,
    (method, path, body): &(&'static str, String, Value),
    token: Option<&str>,
) -> RequestBuilder {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = server
        .client
        .request(method, server.url(path))
        .header("idempotency-key", RequestId::new().to_string());
    if !body.is_null() {
        request = request.json(body);
    }
    with_token(request, token)
}

#[tokio::test]
async fn every_route_answers_another_tenant_as_if_nothing_were_there() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let alice = store
        .create_token(&Namespace::new("alice").unwrap())
        .await
        .unwrap();
    let bob = store
        .create_token(&Namespace::new("bob").unwrap())
        .await
        .unwrap();
    let replies = vec![text_reply("hers", usage(1, 1))];
    let server = start_with_tokens(store.clone(), agent(scripted(replies), vec![])).await;
    let conversation = ConversationId::new().to_string();
    let key = RequestId::new().to_string();
    let (status, done) = answer(
        server
            .client
            .post(server.requests(&conversation))
            .header("idempotency-key", &key)
            .bearer_auth(&alice.token)
            .json(&json!({"input": "hi"})),
    )
    .await;
    assert_eq!(status, 200, "{done}");

    let missing = ConversationId::new().to_string();
    let (status, nothing) = answer(
        server
            .client
            .get(server.url(&format!("/v1/conversations/{missing}")))
            .bearer_auth(&bob.token),
    )
    .await;
    assert_eq!(status, 404);
    for route in routes(&conversation, &key) {
        let (status, body) = answer(call_route(&server, &route, Some(&bob.token))).await;
        assert_eq!((status, &body), (404, &nothing), "{} {}", route.0, route.1);
        let (status, body) = answer(call_route(&server, &route, None)).await;
        assert_eq!(status, 401, "{} {}: {body}", route.0, route.1);
    }
    let (status, listed) = answer(
        server
            .client
            .get(server.url("/v1/conversations"))
            .bearer_auth(&bob.token),
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["conversations"], json!([]), "none of Alice's");

    // Her request's id on a conversation of his own: as unknown as any.
    let his = ConversationId::new().to_string();
    let (status, _) = answer(call_route(
        &server,
        &(
            "PUT",
            format!("/v1/conversations/{his}/metadata"),
            json!({"meta_version": 0}),
        ),
        Some(&bob.token),
    ))
    .await;
    assert_eq!(status, 200);
    let unknown = RequestId::new().to_string();
    let naming_a_request = |(method, path, _): &(&str, String, Value)| {
        path.contains("/requests/") || (*method == "POST" && path.ends_with("/approvals"))
    };
    let pairs = routes(&his, &key).into_iter().zip(routes(&his, &unknown));
    for (hers, nobodys) in pairs.filter(|(hers, _)| naming_a_request(hers)) {
        let (status, body) = answer(call_route(&server, &hers, Some(&bob.token))).await;
        let (_, none) = answer(call_route(&server, &nobodys, Some(&bob.token))).await;
        assert_eq!((status, &body), (404, &none), "{} {}", hers.0, hers.1);
    }

    assert!(store.revoke_token(alice.id).await.unwrap());
    for route in routes(&conversation, &key) {
        let (status, body) = answer(call_route(&server, &route, Some(&alice.token))).await;
        assert_eq!(status, 401, "{} {}: {body}", route.0, route.1);
    }

    // Nothing was written: her conversation is as her request left it.
    let id: ConversationId = conversation.parse().unwrap();
    let alice_ns = Namespace::new("alice").unwrap();
    let hers = store.conversation_meta(&alice_ns, id).await.unwrap();
    assert_eq!((hers.meta_version, hers.title), (0, None));
    assert_eq!(store.conversation(&alice_ns, id).await.unwrap().version, 1);
    assert_eq!(store.events_after(id, 0, 100).await.unwrap().len(), 2);
    assert!(store
        .conversation(&Namespace::new("bob").unwrap(), id)
        .await
        .is_err());
}
