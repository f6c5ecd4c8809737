//! A server-sent-events parser.
//!
//! Hand-written on purpose: it bounds every line and event
//! ([`SseParser::MAX_EVENT_BYTES`]) and the whole stream
//! ([`SseParser::MAX_STREAM_BYTES`]), which eventsource-stream does not
//! offer, and it has no reconnection semantics, which a non-idempotent POST
//! must not have. It yields each event's name and `data`.

use turnstile_core::ModelError;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `event` field; `message` when it has none.
    pub name: String,
    /// Its `data` lines, joined by line feeds.
    pub data: String,
}

/// Splits a byte stream into server-sent events.
pub struct SseParser {
    /// What the stream is, for errors: "chat completion stream".
    what: &'static str,
    buffer: Vec<u8>,
    /// Bytes at the start of `buffer` known to hold no line end.
    scanned: usize,
    data: Option<String>,
    name: Option<String>,
    /// Bytes pushed so far.
    received: usize,
}

impl SseParser {
    /// The largest line or event accepted.
    pub const MAX_EVENT_BYTES: usize = 8 << 20;
    /// The most a stream may send, all its events together (as much as a
    /// model client takes in one non-streamed answer).
    pub const MAX_STREAM_BYTES: usize = 32 << 20;

    /// A parser for a stream that errors call `what`.
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            buffer: Vec::new(),
            scanned: 0,
            data: None,
            name: None,
            received: 0,
        }
    }

    /// Takes the next bytes of the stream; each event they complete goes to
    /// `events`.
    ///
    /// # Errors
    /// A fatal [`ModelError`] for a line or event over
    /// [`MAX_EVENT_BYTES`](Self::MAX_EVENT_BYTES), a stream over
    /// [`MAX_STREAM_BYTES`](Self::MAX_STREAM_BYTES), or text not UTF-8.
    pub fn push(&mut self, bytes: &[u8], events: &mut Vec<SseEvent>) -> Result<(), ModelError> {
        self.received += bytes.len();
        if self.received > Self::MAX_STREAM_BYTES {
            return Err(ModelError::fatal(format!(
                "the {} exceeds {} MiB",
                self.what,
                Self::MAX_STREAM_BYTES >> 20
            )));
        }
        self.buffer.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(offset) = self.buffer[start + self.scanned..]
            .iter()
            .position(|&b| b == b'\n')
        {
            let end = start + self.scanned + offset;
            Self::line(
                self.what,
                (&mut self.name, &mut self.data),
                &self.buffer[start..end],
                events,
            )?;
            start = end + 1;
            self.scanned = 0;
        }
        self.buffer.drain(..start);
        self.scanned = self.buffer.len();
        if self.buffer.len() > Self::MAX_EVENT_BYTES {
            return Err(ModelError::fatal(format!(
                "malformed {}: a line exceeds {} MiB",
                self.what,
                Self::MAX_EVENT_BYTES >> 20
            )));
        }
        Ok(())
    }

    /// The end of the stream. An event it cut off is a truncated stream,
    /// unless `complete` accepts its data (a final event that only lacks
    /// its line ends); then it goes to `events`.
    ///
    /// # Errors
    /// A fatal [`ModelError`] saying the stream is truncated.
    pub fn finish(
        &mut self,
        events: &mut Vec<SseEvent>,
        complete: impl Fn(&str) -> bool,
    ) -> Result<(), ModelError> {
        let rest = std::mem::take(&mut self.buffer);
        self.scanned = 0;
        if !rest.is_empty() {
            Self::line(self.what, (&mut self.name, &mut self.data), &rest, events)?;
        }
        let name = self.name.take();
        match self.data.take() {
            Some(data) if complete(&data) => events.push(SseEvent::new(name, data)),
            Some(_) => {
                return Err(ModelError::fatal(format!(
                    "truncated {}: it ended in the middle of an event",
                    self.what
                )))
            }
            None => {}
        }
        Ok(())
    }

    /// One line: a `data` field is added to the pending event and an
    /// `event` field names it, an empty line dispatches it; comments and
    /// other fields are ignored.
    fn line(
        what: &str,
        (name, pending): (&mut Option<String>, &mut Option<String>),
        line: &[u8],
        events: &mut Vec<SseEvent>,
    ) -> Result<(), ModelError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            let event_name = name.take();
            if let Some(data) = pending.take() {
                events.push(SseEvent::new(event_name, data));
            }
            return Ok(());
        }
        let line = std::str::from_utf8(line).map_err(|_| {
            ModelError::fatal(format!("malformed {what}: an event is not valid utf-8"))
        })?;
        if line.starts_with(':') {
            return Ok(()); // a comment, e.g. a keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field == "event" {
            *name = Some(value.to_owned());
        } else if field == "data" {
            match pending {
                Some(data) => {
                    if data.len() + value.len() > Self::MAX_EVENT_BYTES {
                        return Err(ModelError::fatal(format!(
                            "malformed {what}: an event exceeds {} MiB",
                            Self::MAX_EVENT_BYTES >> 20
                        )));
                    }
                    data.push('\n');
                    data.push_str(value);
                }
                None => *pending = Some(value.to_owned()),
            }
        }
        Ok(())
    }
}

impl SseEvent {
    fn new(name: Option<String>, data: String) -> Self {
        Self {
            name: name.unwrap_or_else(|| "message".into()),
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_done(data: &str) -> bool {
        data.trim() == "[DONE]"
    }

    fn parse(chunks: &[&[u8]]) -> Vec<String> {
        parse_events(chunks).into_iter().map(|e| e.data).collect()
    }

    fn parse_events(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::new("test stream");
        let mut events = Vec::new();
        for chunk in chunks {
            parser.push(chunk, &mut events).unwrap();
        }
        parser.finish(&mut events, is_done).unwrap();
        events
    }

    #[test]
    fn sse_events_are_split_across_chunk_boundaries() {
        let events = parse(&[
            b"event: x\ndata: {\"a\"",
            b":1}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n",
            b"\ndata: [DO",
            b"NE]\n\n",
        ]);
        assert_eq!(events, ["{\"a\":1}", "x\ny", "[DONE]"]);
    }

    #[test]
    fn events_carry_their_names() {
        let events = parse_events(&[b"event: error\ndata: {}\n\ndata: x\n\nevent: ping\n\n"]);
        let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["error", "message"]);
    }

    #[test]
    fn a_stream_may_end_right_after_a_complete_final_event() {
        assert_eq!(parse(&[b"data: x\n\ndata: [DONE]"]), ["x", "[DONE]"]);
        assert_eq!(parse(&[b"data: [DONE]\n"]), ["[DONE]"]);
    }

    #[test]
    fn an_event_cut_off_by_the_end_of_the_stream_is_truncated() {
        for tail in [&b"data: {\"cho"[..], b"data: {}\n"] {
            let mut parser = SseParser::new("test stream");
            let mut events = Vec::new();
            parser.push(tail, &mut events).unwrap();
            let error = parser.finish(&mut events, is_done).unwrap_err();
            assert!(error.message.contains("truncated test stream"), "{error}");
        }
    }

    #[test]
    fn lines_and_events_are_bounded() {
        let mut parser = SseParser::new("test stream");
        let mut events = Vec::new();
        let line = vec![b'a'; SseParser::MAX_EVENT_BYTES + 1];
        let error = parser.push(&line, &mut events).unwrap_err();
        assert!(error.message.contains("a line exceeds 8 MiB"), "{error}");

        let mut parser = SseParser::new("test stream");
        let half = format!("data: {}\n", "b".repeat(SseParser::MAX_EVENT_BYTES / 2 + 1));
        parser.push(half.as_bytes(), &mut events).unwrap();
        let error = parser.push(half.as_bytes(), &mut events).unwrap_err();
        assert!(error.message.contains("an event exceeds 8 MiB"), "{error}");
        assert!(events.is_empty());
    }
}
