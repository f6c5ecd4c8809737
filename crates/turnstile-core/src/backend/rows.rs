//! Rows to domain types and back, for backends: database content is never
//! trusted, so anything undecodable becomes [`Error::Corrupt`] naming the
//! table and key, never a panic.

use std::time::{SystemTime, UNIX_EPOCH};

use uuid::Uuid;

use crate::agent::Budget;
use crate::checkpoint::{CheckpointPhase, LoopCheckpoint};
use crate::error::Error;
use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use crate::message::{Content, Message, ToolResult, Usage, VerificationReport};
use crate::store::{
    ActiveAdmission, Admission, BudgetChange, InputHash, Metadata, SummaryPass, SummaryProgress,
};

/// The time now as Unix milliseconds, the unit of every stored time
/// (0 before 1970, `i64::MAX` past its range).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Counters are u64 in the API and 64-bit signed integers in SQL; values past
/// i64::MAX are clamped, as token counts never get there honestly.
pub fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A transcript entry's key, `conversation/seq`, as an error names it:
/// formatted only then, not for every entry read.
pub struct EntryKey(pub ConversationId, pub i64);

impl std::fmt::Display for EntryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.0, self.1)
    }
}

/// Decoding context: which row of which table is being read.
#[derive(Clone, Copy)]
pub struct Row<'a> {
    /// The table read, as the error names it.
    pub table: &'static str,
    /// The row's key (an id, or id and turn), as the error names it.
    pub key: &'a (dyn std::fmt::Display + Sync),
}

impl Row<'_> {
    /// [`Error::Corrupt`] naming this row and `reason`.
    pub fn corrupt(&self, reason: impl Into<String>) -> Error {
        Error::Corrupt {
            table: self.table,
            key: self.key.to_string(),
            reason: reason.into(),
        }
    }

    /// A counter column: negative is corruption.
    pub fn u64(&self, column: &str, value: i64) -> Result<u64, Error> {
        u64::try_from(value).map_err(|_| self.corrupt(format!("{column} is negative ({value})")))
    }

    /// A turn or pass column: negative or past `u32::MAX` is corruption.
    pub fn u32(&self, column: &str, value: i64) -> Result<u32, Error> {
        u32::try_from(value).map_err(|_| self.corrupt(format!("{column} out of range ({value})")))
    }

    /// A namespace column: one no namespace may have is corruption.
    pub fn namespace(&self, value: &str) -> Result<Namespace, Error> {
        Namespace::new(value).map_err(|e| self.corrupt(format!("namespace: {e}")))
    }

    /// A uuid column: anything but 16 bytes is corruption.
    pub fn uuid(&self, column: &str, bytes: &[u8]) -> Result<Uuid, Error> {
        Uuid::from_slice(bytes).map_err(|_| self.corrupt(format!("{column} is not a 16-byte uuid")))
    }

    /// An id column: a 16-byte uuid that is not nil.
    pub fn id<T: TryFrom<Uuid>>(&self, column: &str, bytes: &[u8]) -> Result<T, Error> {
        self.checked_id(column, self.uuid(column, bytes)?)
    }

    /// An id read as a uuid already: the nil uuid is corruption here, not
    /// bad input.
    pub fn checked_id<T: TryFrom<Uuid>>(&self, column: &str, uuid: Uuid) -> Result<T, Error> {
        T::try_from(uuid).map_err(|_| self.corrupt(format!("{column} is the nil uuid")))
    }

    /// A SHA-256 column: anything but 32 bytes is corruption.
    pub fn hash(&self, column: &str, bytes: &[u8]) -> Result<InputHash, Error> {
        <[u8; 32]>::try_from(bytes)
            .map(InputHash)
            .map_err(|_| self.corrupt(format!("{column} is not a 32-byte sha-256")))
    }

    /// The four token columns as a [`Usage`].
    pub fn usage(
        &self,
        input: i64,
        output: i64,
        cache_read: i64,
        cache_write: i64,
    ) -> Result<Usage, Error> {
        Ok(Usage {
            input_tokens: self.u64("input_tokens", input)?,
            output_tokens: self.u64("output_tokens", output)?,
            cache_read_tokens: self.u64("cache_read_tokens", cache_read)?,
            cache_write_tokens: self.u64("cache_write_tokens", cache_write)?,
        })
    }
}

/// Serializes a value the crate itself defines; these never fail, but a
/// failure is still reported rather than unwrapped.
pub fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    serde_json::to_string(value)
        .map_err(|e| Error::InvalidInput(format!("value cannot be serialized: {e}")))
}

/// A message as its stored columns: role, text, and its other fields as a
/// `meta` JSON object (`None` when it has none). Plain text is stored as it
/// is, never JSON-escaped; content with other parts is stored whole in
/// `meta` as `parts`, with an empty text column.
pub fn message_columns(message: &Message) -> Result<(String, String, Option<String>), Error> {
    let mut fields = stored_fields(message)?;
    let role = match fields.remove("role") {
        Some(serde_json::Value::String(role)) => role,
        _ => return Err(Error::InvalidInput("a message has a role".into())),
    };
    let content = match fields.remove("content") {
        Some(serde_json::Value::String(content)) => content,
        _ => return Err(Error::InvalidInput("a message has a text".into())),
    };
    let meta = if fields.is_empty() {
        None
    } else {
        Some(to_json(&fields)?)
    };
    Ok((role, content, meta))
}

/// Messages as one JSON array of stored rows, for a statement that splits
/// each into its columns: `role` and `content` (text) become columns and
/// the other fields `meta`, as [`message_columns`] splits them.
pub fn stored_messages_json(messages: &[Message]) -> Result<String, Error> {
    let rows = messages
        .iter()
        .map(stored_fields)
        .collect::<Result<Vec<_>, Error>>()?;
    to_json(&rows)
}

/// A message's fields as stored: its serde fields, with content that is not
/// plain text moved from `content` (then empty) to `parts`.
fn stored_fields(message: &Message) -> Result<serde_json::Map<String, serde_json::Value>, Error> {
    let serde_json::Value::Object(mut fields) = serde_json::to_value(message)
        .map_err(|e| Error::InvalidInput(format!("message cannot be serialized: {e}")))?
    else {
        return Err(Error::InvalidInput(
            "a message serializes to an object".into(),
        ));
    };
    if message.content().as_plain_text().is_none() {
        if let Some(parts) = fields.insert("content".into(), "".into()) {
            fields.insert("parts".into(), parts);
        }
    }
    Ok(fields)
}

/// Rebuilds a message from its stored role, text and `meta` JSON object
/// (the message's other fields): the inverse of [`message_columns`].
pub fn decode_message(
    row: &Row<'_>,
    role: &str,
    content: String,
    meta: Option<&str>,
) -> Result<Message, Error> {
    // A text message with nothing in its meta, most of a transcript, as the
    // general way below decodes it, without building a JSON object for it.
    if meta.is_none() {
        match role {
            "user" => return Ok(Message::user(content)),
            "assistant" => return Ok(Message::assistant(content)),
            "system" => return Ok(Message::system(content)),
            _ => {}
        }
    }
    let mut fields = match meta {
        None => serde_json::Map::new(),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => return Err(row.corrupt("meta is not a JSON object")),
            Err(e) => return Err(row.corrupt(format!("meta: {e}"))),
        },
    };
    let content = match fields.remove("parts") {
        None => content.into(),
        Some(_) if !content.is_empty() => {
            return Err(row.corrupt("a message with parts has a text column"))
        }
        Some(parts @ serde_json::Value::Array(_)) => parts,
        Some(_) => return Err(row.corrupt("parts is not a JSON array")),
    };
    fields.insert("role".into(), role.into());
    fields.insert("content".into(), content);
    serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| row.corrupt(format!("message: {e}")))
}

/// A tool result's content as its journal columns: plain text in
/// `result` (as it is, never JSON-escaped) with no `result_parts`; other
/// content as an empty `result` and its parts as a JSON array in
/// `result_parts`.
pub fn tool_result_columns(result: &ToolResult) -> Result<(String, Option<String>), Error> {
    match result.content.as_plain_text() {
        Some(text) => Ok((text.to_owned(), None)),
        None => Ok((String::new(), Some(to_json(&result.content)?))),
    }
}

/// Rebuilds a journaled tool result from its `result` and `result_parts`
/// columns: the inverse of [`tool_result_columns`].
pub fn decode_tool_result(
    row: &Row<'_>,
    text: String,
    parts: Option<&str>,
    is_error: bool,
) -> Result<ToolResult, Error> {
    let content = match parts {
        None => Content::from(text),
        Some(_) if !text.is_empty() => {
            return Err(row.corrupt("a result with parts has a text column"))
        }
        Some(parts) => serde_json::from_str::<Content>(parts)
            .map_err(|e| row.corrupt(format!("result_parts: {e}")))?,
    };
    Ok(ToolResult { content, is_error })
}

/// An admission row as every backend reads it (ids already as uuids),
/// each field the `admissions` column of the same name.
pub struct AdmissionRow {
    /// The admission's revision.
    pub revision: i64,
    /// `active_request_id`: `None` when the admission is idle.
    pub active_request_id: Option<Uuid>,
    /// `input_sha256` of the active request.
    pub input_sha256: Option<Vec<u8>>,
    /// `run_id` of the owning run.
    pub run_id: Option<Uuid>,
    /// `agent_fingerprint` the request was admitted with.
    pub agent_fingerprint: Option<String>,
    /// `input_tokens` spent by the active request.
    pub input_tokens: i64,
    /// `output_tokens` spent by the active request.
    pub output_tokens: i64,
    /// `cache_read_tokens` spent by the active request.
    pub cache_read_tokens: i64,
    /// `cache_write_tokens` spent by the active request.
    pub cache_write_tokens: i64,
    /// `summary_passes` the active request committed.
    pub summary_passes: i64,
    /// `summary_from_seq` of the pass in flight.
    pub summary_from_seq: Option<i64>,
    /// `summary_through_seq` of the pass in flight.
    pub summary_through_seq: Option<i64>,
    /// `summary_version`: the conversation version the pass in flight read.
    pub summary_version: Option<i64>,
    /// `summary_prompt_sha256` of the pass in flight.
    pub summary_prompt_sha256: Option<Vec<u8>>,
}

impl AdmissionRow {
    /// The admission of `conversation_id`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a value out of range, or an active admission
    /// or pass in flight with a column missing.
    pub fn decode(self, conversation_id: ConversationId) -> Result<Admission, Error> {
        let key = Row {
            table: "admissions",
            key: &conversation_id,
        };
        let revision = Revision(key.u64("revision", self.revision)?);
        let active = match self.active_request_id {
            None => None,
            Some(request) => Some(ActiveAdmission {
                request_id: key.checked_id::<RequestId>("active_request_id", request)?,
                input_sha256: key.hash(
                    "input_sha256",
                    self.input_sha256.as_deref().unwrap_or_default(),
                )?,
                run_id: key.checked_id(
                    "run_id",
                    self.run_id
                        .ok_or_else(|| key.corrupt("active admission without run_id"))?,
                )?,
                agent_fingerprint: self
                    .agent_fingerprint
                    .ok_or_else(|| key.corrupt("active admission without agent_fingerprint"))?,
                usage: key.usage(
                    self.input_tokens,
                    self.output_tokens,
                    self.cache_read_tokens,
                    self.cache_write_tokens,
                )?,
                summary: SummaryProgress {
                    passes: key.u32("summary_passes", self.summary_passes)?,
                    pending: pending_pass(
                        &key,
                        self.summary_from_seq,
                        self.summary_through_seq,
                        self.summary_version,
                        self.summary_prompt_sha256.as_deref(),
                    )?,
                },
            }),
        };
        Ok(Admission {
            conversation_id,
            revision,
            active,
        })
    }
}

/// The summary pass in flight: all of its columns, or none.
fn pending_pass(
    key: &Row<'_>,
    from_seq: Option<i64>,
    through_seq: Option<i64>,
    version: Option<i64>,
    prompt: Option<&[u8]>,
) -> Result<Option<SummaryPass>, Error> {
    match (from_seq, through_seq, version, prompt) {
        (None, None, None, None) => Ok(None),
        (Some(from), Some(through), Some(version), Some(prompt)) => Ok(Some(SummaryPass {
            from_seq: key.u64("summary_from_seq", from)?,
            through_seq: key.u64("summary_through_seq", through)?,
            transcript_version: key.u64("summary_version", version)?,
            prompt_sha256: key.hash("summary_prompt_sha256", prompt)?.0,
        })),
        _ => Err(key.corrupt("a summary pass in flight with missing columns")),
    }
}

/// The metadata as stored: compact JSON.
pub fn metadata_json(metadata: &Metadata) -> String {
    // A map of JSON values always serializes.
    serde_json::to_string(metadata).unwrap_or_else(|_| "{}".to_owned())
}

/// Stored metadata text back to the object.
///
/// # Errors
/// [`Error::Corrupt`] unless it is a JSON object.
pub fn decode_metadata(row: &Row<'_>, text: &str) -> Result<Metadata, Error> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        _ => Err(row.corrupt("metadata is not a JSON object")),
    }
}

/// A request's budget as it is stored (`requests.budget`): a JSON object
/// of the limits set, `None` (SQL NULL) for none.
pub fn budget_json(budget: &Budget) -> Option<String> {
    // Three optional integers always serialize.
    (!budget.is_unlimited()).then(|| serde_json::to_string(budget).unwrap_or_default())
}

/// A budget change as it is stored (`runs.budget_change`).
pub fn budget_change_json(change: Option<&BudgetChange>) -> Option<String> {
    change.map(|c| serde_json::to_string(c).unwrap_or_default())
}

/// A stored budget read back (`requests.budget`).
pub fn decode_budget(row: &Row<'_>, text: Option<&str>) -> Result<Budget, Error> {
    text.map_or(Ok(Budget::default()), |text| {
        serde_json::from_str(text).map_err(|_| row.corrupt("budget is not a budget object"))
    })
}

/// A stored budget change read back (`runs.budget_change`).
pub fn decode_budget_change(
    row: &Row<'_>,
    text: Option<&str>,
) -> Result<Option<BudgetChange>, Error> {
    text.map(|text| {
        serde_json::from_str(text).map_err(|_| row.corrupt("budget_change is not a budget change"))
    })
    .transpose()
}

/// A loop checkpoint row as every backend reads it, each field the
/// `loop_checkpoints` column of the same name.
pub struct CheckpointRow {
    /// The turn it was saved for.
    pub turn: i64,
    /// `phase`, as its stored name.
    pub phase: String,
    /// `input_tokens` of the request so far.
    pub input_tokens: i64,
    /// `output_tokens` of the request so far.
    pub output_tokens: i64,
    /// `cache_read_tokens` of the request so far.
    pub cache_read_tokens: i64,
    /// `cache_write_tokens` of the request so far.
    pub cache_write_tokens: i64,
    /// `tool_calls_count` of the request so far.
    pub tool_calls_count: i64,
    /// `reports_count`: how many of the request's verification reports it
    /// holds.
    pub reports_count: i64,
    /// `message_count`: the request's messages so far.
    pub message_count: i64,
    /// `created_at`, Unix milliseconds.
    pub created_at: i64,
}

impl CheckpointRow {
    /// The checkpoint, with the first `reports_count` of the request's
    /// `reports` (which must hold at least that many).
    pub fn decode(
        self,
        run_id: RunId,
        reports: &[VerificationReport],
    ) -> Result<LoopCheckpoint, Error> {
        let key = format!("{run_id}/{}", self.turn);
        let row = Row {
            table: "loop_checkpoints",
            key: &key,
        };
        let count = usize::try_from(row.u64("reports_count", self.reports_count)?)
            .map_err(|_| row.corrupt("reports_count out of range"))?;
        if count > reports.len() {
            return Err(row.corrupt(format!(
                "counts {count} verification reports, {} stored",
                reports.len()
            )));
        }
        Ok(LoopCheckpoint {
            run_id,
            turn: row.u32("turn", self.turn)?,
            phase: CheckpointPhase::parse(&self.phase)
                .ok_or_else(|| row.corrupt(format!("unknown phase {:?}", self.phase)))?,
            usage: row.usage(
                self.input_tokens,
                self.output_tokens,
                self.cache_read_tokens,
                self.cache_write_tokens,
            )?,
            tool_calls_count: row.u64("tool_calls_count", self.tool_calls_count)?,
            verification_reports: reports[..count].to_vec(),
            message_count: row.u64("message_count", self.message_count)?,
            created_at: self.created_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Content, Part, ProviderMetadata, Reasoning, ToolCall};

    #[test]
    fn a_text_message_without_meta_decodes_as_the_general_way_does() {
        let row = Row {
            table: "transcript",
            key: &"c/0",
        };
        for role in ["user", "assistant", "system"] {
            for text in ["", "hello", "nul\0inside \"quoted\""] {
                let general: Message =
                    serde_json::from_value(serde_json::json!({"role": role, "content": text}))
                        .expect("the general way");
                let decoded = decode_message(&row, role, text.to_owned(), None);
                // Compared part by part: `Content`'s equality takes no parts
                // and one empty text part for the same.
                let (decoded, general) = (decoded.expect("decoded"), general);
                assert_eq!(
                    format!("{decoded:?}"),
                    format!("{general:?}"),
                    "{role}: {text:?}"
                );
            }
        }
        // The other roles go the general way: a tool result without its
        // call id, an unknown role, are still corrupt.
        for role in ["tool", "robot"] {
            let decoded = decode_message(&row, role, "x".to_owned(), None);
            assert!(
                matches!(decoded, Err(Error::Corrupt { .. })),
                "{role}: {decoded:?}"
            );
        }
    }

    #[test]
    fn every_kind_of_message_round_trips_through_its_columns() {
        let messages = [
            Message::system("be brief"),
            Message::user("nul\0inside \"quoted\""),
            Message::assistant("plain"),
            Message::assistant_with_calls(
                "",
                vec![ToolCall::new("c1", "search", serde_json::json!({"q": "x"}))],
            ),
            Message::tool("c1", "failed", true),
            Message::Assistant {
                content: Content::new(vec![
                    Part::Reasoning(Reasoning {
                        provider: "anthropic".into(),
                        text: Some("why\0".into()),
                        signature: Some("c2ln".repeat(100)),
                        redacted: None,
                    }),
                    Part::text("answer"),
                ]),
                tool_calls: vec![ToolCall {
                    provider_metadata: Some(
                        ProviderMetadata::new(r#"{"google": {"thought_signature": "x"}}"#)
                            .expect("object"),
                    ),
                    ..ToolCall::new("c2", "search", serde_json::json!({}))
                }],
                provider_metadata: Some(ProviderMetadata::new("{ \"n\": 1e400 }").expect("object")),
            },
            Message::user(String::new()),
        ];
        let key = Row {
            table: "test",
            key: &"k",
        };
        for message in messages {
            let (role, content, meta) = message_columns(&message).expect("columns");
            assert_eq!(
                Some(content.as_str()),
                message.content().as_plain_text().or(Some(""))
            );
            let back = decode_message(&key, &role, content, meta.as_deref()).expect("decode");
            assert_eq!(back, message);
        }
        assert_eq!(
            message_columns(&Message::user("x")).expect("columns").2,
            None
        );
    }
}
