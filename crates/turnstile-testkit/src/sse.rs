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
    /// The live events read so far (they have no `id`), in order: each
    /// one's kind (`delta`, `tool_started`, or an `error` that ends the
    /// stream) and `data`.
    pub live: Vec<(String, Value)>,
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
            live: Vec::new(),
        }
    }

    /// The next numbered event, within 10 s; keep-alive comments are
    /// skipped and live events are kept in [`SseReader::live`].
    pub async fn next(&mut self) -> Sse {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse(&block) {
                    return event;
                }
                if let Some(live) = live(&block) {
                    self.live.push(live);
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

    /// The `data` of each live `delta` read so far, in order.
    pub fn deltas(&self) -> Vec<&Value> {
        self.live_of("delta")
    }

    /// The `data` of each live event of `kind` read so far, in order.
    pub fn live_of(&self, kind: &str) -> Vec<&Value> {
        self.live
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, data)| data)
            .collect()
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

/// The kind and data of a live event: one with no `id`.
fn live(block: &str) -> Option<(String, Value)> {
    if block.lines().any(|l| l.starts_with("id:")) {
        return None;
    }
    let kind = block.lines().find_map(|l| l.strip_prefix("event:"))?;
    let data = block.lines().find_map(|l| l.strip_prefix("data:"))?;
    let data = serde_json::from_str(data.trim()).expect("JSON data");
    Some((kind.trim().to_owned(), data))
}
