//! Slow clients over raw TCP: a request head that never ends is cut off at
//! its deadline, a body that never ends is `408` and writes nothing, and
//! the server goes on serving.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use turnstile::{ConversationId, RequestId};
use turnstile_server::Server;
use turnstile_testkit::session::*;

use crate::support::{start_server, store_in};

/// Reads `stream` until the server closes it or `enough` is in what was
/// read, within 10 s: what was read, and whether it closed.
async fn read_until(stream: &mut TcpStream, enough: &str) -> (String, bool) {
    let mut read = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("the server answers or closes within 10 s")
            .unwrap_or(0);
        read.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&read).into_owned();
        if n == 0 || (!enough.is_empty() && text.contains(enough)) {
            return (text, n == 0);
        }
    }
}

#[tokio::test]
async fn a_slow_head_is_cut_off_a_slow_body_is_408_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let agent = agent(scripted(vec![text_reply("fine", usage(1, 1))]), vec![]);
    let deadline = Duration::from_millis(300);
    let server = start_server(
        Server::new(store.clone(), agent, ns()).with_read_deadlines(deadline, deadline),
    )
    .await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let conversation = ConversationId::new().to_string();
    let path = format!("/v1/conversations/{conversation}/requests");

    // A head that never ends: the connection is closed, nothing answered.
    let started = Instant::now();
    let mut head = TcpStream::connect(&address).await.unwrap();
    head.write_all(format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n").as_bytes())
        .await
        .unwrap();
    let (answered, closed) = read_until(&mut head, "").await;
    assert!(closed, "{answered}");
    assert!(started.elapsed() >= deadline);

    // A body that never ends: 408, and the request is not admitted.
    let key = RequestId::new().to_string();
    let mut body = TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Idempotency-Key: {key}\r\nContent-Length: 100\r\n\r\n{{\"input\": \""
    );
    body.write_all(request.as_bytes()).await.unwrap();
    let (answered, _) = read_until(&mut body, "request_timeout").await;
    assert!(answered.starts_with("HTTP/1.1 408"), "{answered}");
    assert!(answered.contains("nothing was written"), "{answered}");
    let id: ConversationId = conversation.parse().unwrap();
    assert!(
        store.conversation(&ns(), id).await.is_err(),
        "nothing was written"
    );

    // The server goes on: the same key, sent whole, runs.
    let (status, outcome) = server.post(&conversation, &key, "hello").await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(outcome["final_text"], "fine");
    server.shut_down().await;
}
