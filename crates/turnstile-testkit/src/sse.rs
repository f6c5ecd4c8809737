//! A reader of server-sent events over a real HTTP connection: the event
//! streams of `turnstile serve`, read by its tests.

use serde_json::Value;

/// One server-sent event: its `id`, `event` and `data` (as JSON).
#[derive(Debug, PartialEq)]
pub struct Sse {
    /// The event's number.
    pub id: u64,
    /// Its kind (`event:`).
    pub kind: String,
    /// Its `data:`, parsed.
    pub data: Value,
}

/// Reads events from an open event stream.
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
    /// The live text read so far: the `data` of each `delta` event (which
    /// has no `id`), in order.
    pub deltas: Vec<Value>,
}

impl SseReader {
    /// Reads `response`, which must be a `200` event stream.
    pub fn new(response: reqwest::Response) -> Self {
        assert_eq!(response.status().as_u16(), 200, "{response:?}");
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Self {
            response,
            buffer: String::new(),
            deltas: Vec::new(),
        }
    }

    /// The next numbered event, within 10 s; keep-alive comments are
    /// skipped and live text is kept in [`SseReader::deltas`].
    pub async fn next(&mut self) -> Sse {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse(&block) {
                    return event;
                }
                if let Some(delta) = live_text(&block) {
                    self.deltas.push(delta);
                }
                continue;
            }
            let chunk =
                tokio::time::timeout(std::time::Duration::from_secs(10), self.response.chunk())
                    .await
                    .expect("an event within 10 s")
                    .expect("read the stream")
                    .expect("the stream goes on");
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }
}

fn parse(block: &str) -> Option<Sse> {
    let (mut id, mut kind, mut data) = (None, None, None);
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().parse().expect("a numeric id"));
        } else if let Some(v) = line.strip_prefix("event:") {
            kind = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data = Some(serde_json::from_str(v.trim()).expect("JSON data"));
        }
    }
    Some(Sse {
        id: id?,
        kind: kind?,
        data: data?,
    })
}

/// The data of a `delta` event, which has no `id`.
fn live_text(block: &str) -> Option<Value> {
    let is_delta = block.lines().any(|l| l.trim_end() == "event: delta");
    let numbered = block.lines().any(|l| l.starts_with("id:"));
    let data = block.lines().find_map(|l| l.strip_prefix("data:"))?;
    (is_delta && !numbered).then(|| serde_json::from_str(data.trim()).expect("JSON data"))
}
