//! Message text for the workload: `bytes` bytes of ASCII prose, different for
//! every message, so the database holds varied content rather than one
//! repeated string.

/// Which side of a turn a message is.
#[derive(Clone, Copy)]
pub(super) enum Role {
    User,
    Assistant,
}

// One compact block: a word list is read across, not down.
#[rustfmt::skip]
const WORDS: [&str; 48] = [
    "agent", "durable", "turn", "sqlite", "checkpoint", "admission", "request", "answer", "tool",
    "conversation", "revision", "commit", "replay", "summary", "budget", "token", "window",
    "transcript", "journal", "fence", "recover", "resume", "model", "script", "latency", "page",
    "write", "read", "the", "a", "of", "and", "to", "in", "is", "with", "for", "after", "before",
    "every", "one", "two", "three", "seven", "ninety", "north", "green", "quiet",
];

/// The text of one message of the workload: deterministic for (conversation,
/// turn, role), so a replay can check it got the answer that was written.
pub(super) fn message(conversation: u32, turn: u32, role: Role, bytes: usize) -> String {
    let seed = (u64::from(conversation) << 32) | (u64::from(turn) << 1) | role as u64;
    let mut random = SplitMix64(seed);
    let mut text = String::with_capacity(bytes + 16);
    while text.len() < bytes {
        let draw = random.next();
        // About one token in eight is a number, so digits vary too.
        if draw.is_multiple_of(8) && !text.is_empty() {
            text.push_str(&(draw >> 40).to_string());
        } else {
            text.push_str(WORDS[(draw >> 8) as usize % WORDS.len()]);
        }
        // And about one in thirteen ends a sentence.
        text.push_str(if draw.is_multiple_of(13) { ". " } else { " " });
    }
    // ASCII only, so any byte length is a character boundary.
    text.truncate(bytes);
    text
}

/// A tiny, well-mixed generator (Steele et al.'s SplitMix64).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
