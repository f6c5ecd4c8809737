//! A follower cut off at random points while 100 requests run, each time
//! reconnecting with `Last-Event-ID`: every event once, in order, as
//! stored. (A cut can drop bytes of later events already received: the
//! reconnect asks for them again.)

use turnstile::{ConversationId, RequestId};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::CountingTool;

use crate::support::{assert_as_stored, counting_script, start, store_in, ONE_REQUEST};

const REQUESTS: usize = 100;

/// xorshift64: the cut points, the same on every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[tokio::test]
async fn a_follower_cut_off_at_random_points_of_100_requests_sees_every_event_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let count = CountingTool::new("count");
    let server = std::sync::Arc::new(
        start(
            store.clone(),
            agent(scripted(counting_script()), vec![count.clone()]),
        )
        .await,
    );
    let conversation = ConversationId::new().to_string();
    server.create(&conversation.to_string()).await;

    let requests = {
        let (server, conversation) = (server.clone(), conversation.clone());
        tokio::spawn(async move {
            for i in 0..REQUESTS {
                let key = RequestId::new().to_string();
                let (status, body) = server
                    .post(&conversation, &key, &format!("count {i}"))
                    .await;
                assert_eq!(status, 200, "{body}");
            }
        })
    };
    let total = REQUESTS * ONE_REQUEST.len();
    let mut seen = Vec::with_capacity(total);
    let (mut state, mut reconnects) = (0x2545_f491_4f6c_dd1d_u64, 0);
    while seen.len() < total {
        let after = seen.last().map_or(0, |e: &crate::support::Sse| e.id);
        let mut reader = server.follow(&conversation, after).await;
        let cut = 1 + next(&mut state) % 9;
        for _ in 0..cut {
            if seen.len() == total {
                break;
            }
            seen.push(reader.next().await);
        }
        reconnects += 1;
    }
    requests.await.unwrap();
    assert!(reconnects > REQUESTS / 2, "{reconnects} connections");

    let ids: Vec<u64> = seen.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        (1..=total as u64).collect::<Vec<_>>(),
        "each once, in order"
    );
    for (i, request) in seen.chunks(ONE_REQUEST.len()).enumerate() {
        let kinds: Vec<&str> = request.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ONE_REQUEST, "request {i}");
    }
    assert_as_stored(store.as_ref(), conversation.parse().unwrap(), &seen).await;
    assert_eq!(count.calls(), REQUESTS, "each call ran once");
}
