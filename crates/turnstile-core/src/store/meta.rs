//! Conversation metadata: an optional title, an optional owner and a small
//! JSON object, kept beside the conversation and changed only by a
//! compare-and-swap on its own version (`meta_version`), apart from the
//! admission's revision: labelling a conversation never fences its runs.
//!
//! Everything is validated here, before any backend writes: a value out of
//! its bound is [`Error::InvalidInput`] naming the bound, and nothing is
//! written.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::backend::metadata_json;
use crate::error::Error;
use crate::ids::ConversationId;

/// The most bytes a title may have (UTF-8; at least one).
pub const MAX_TITLE_BYTES: usize = 256;
/// The most bytes an owner may have (UTF-8; at least one).
pub const MAX_OWNER_BYTES: usize = 256;
/// The most keys the metadata object may have.
pub const MAX_METADATA_KEYS: usize = 64;
/// The most bytes a metadata key may have (at least one).
pub const MAX_METADATA_KEY_BYTES: usize = 128;
/// The most bytes the metadata object may take serialized as compact JSON.
pub const MAX_METADATA_BYTES: usize = 8192;

/// The metadata object: keys to any JSON values.
pub type Metadata = Map<String, Value>;

/// A conversation's metadata as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConversationMeta {
    /// A short human title; `None` until set.
    pub title: Option<String>,
    /// Who the conversation belongs to, as the application names it
    /// (listings filter on it); `None` until set.
    pub owner: Option<String>,
    /// The application's own keys and values (listings filter on them).
    pub metadata: Metadata,
    /// +1 per change; 0 until the first. The compare-and-swap token of
    /// [`Store::set_conversation_meta`](super::Store::set_conversation_meta).
    pub meta_version: u64,
    /// Unix milliseconds of the last change (the conversation's creation
    /// until the first).
    pub updated_at: i64,
}

/// A change of metadata. `None` fields are kept; `Some(None)` clears the
/// title or owner. `set` keys are written (replacing their values), then
/// `unset` keys removed; a key in both is refused.
///
/// Build one with the methods below, or as a struct literal:
///
/// ```
/// use serde_json::json;
/// use turnstile_core::store::MetaUpdate;
///
/// let update = MetaUpdate::default()
///     .with_title("Refund for order 1182")
///     .with_owner_cleared()
///     .with_key("tier", json!("gold"))
///     .without_key("draft");
/// assert_eq!(update.title, Some(Some("Refund for order 1182".into())));
/// assert_eq!(update.owner, Some(None));
/// assert_eq!(update.set["tier"], json!("gold"));
/// assert_eq!(update.unset, ["draft"]);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetaUpdate {
    /// The new title: `Some(Some(_))` sets it, `Some(None)` clears it,
    /// `None` keeps it.
    pub title: Option<Option<String>>,
    /// The new owner, as `title`.
    pub owner: Option<Option<String>>,
    /// Keys written into the metadata object, replacing their values.
    pub set: Metadata,
    /// Keys removed from the metadata object (after `set` is written).
    pub unset: Vec<String>,
}

impl MetaUpdate {
    /// Sets the title.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(Some(title.into()));
        self
    }

    /// Clears the title.
    pub fn with_title_cleared(mut self) -> Self {
        self.title = Some(None);
        self
    }

    /// Sets the owner.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(Some(owner.into()));
        self
    }

    /// Clears the owner.
    pub fn with_owner_cleared(mut self) -> Self {
        self.owner = Some(None);
        self
    }

    /// Writes `key` with `value` into the metadata object.
    pub fn with_key(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.set.insert(key.into(), value.into());
        self
    }

    /// Removes `key` from the metadata object.
    pub fn without_key(mut self, key: impl Into<String>) -> Self {
        self.unset.push(key.into());
        self
    }

    /// Whether it changes nothing (it still moves `meta_version` on).
    pub fn is_empty(&self) -> bool {
        self.title.is_none() && self.owner.is_none() && self.set.is_empty() && self.unset.is_empty()
    }

    /// The metadata `current` becomes, checked against every bound.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the bound the update or its result
    /// breaks.
    pub fn apply(&self, current: &ConversationMeta) -> Result<ConversationMeta, Error> {
        for key in &self.unset {
            check_key(key)?;
            if self.set.contains_key(key) {
                return Err(invalid(format!(
                    "metadata key {key:?} is both set and unset"
                )));
            }
        }
        let mut next = current.clone();
        if let Some(title) = &self.title {
            next.title = title.clone();
        }
        if let Some(owner) = &self.owner {
            next.owner = owner.clone();
        }
        for (key, value) in &self.set {
            next.metadata.insert(key.clone(), value.clone());
        }
        for key in &self.unset {
            next.metadata.remove(key);
        }
        check_meta(next.title.as_deref(), next.owner.as_deref(), &next.metadata)?;
        Ok(next)
    }
}

/// Checks a title, an owner and a metadata object against the bounds.
///
/// # Errors
/// [`Error::InvalidInput`] naming the first bound broken.
pub fn check_meta(
    title: Option<&str>,
    owner: Option<&str>,
    metadata: &Metadata,
) -> Result<(), Error> {
    if let Some(title) = title {
        check_text("title", title, MAX_TITLE_BYTES)?;
    }
    if let Some(owner) = owner {
        check_owner(owner)?;
    }
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(invalid(format!(
            "metadata has {} keys, more than the limit of {MAX_METADATA_KEYS} keys",
            metadata.len()
        )));
    }
    for (key, value) in metadata {
        check_key(key)?;
        check_value(key, value)?;
    }
    let bytes = metadata_json(metadata).len();
    if bytes > MAX_METADATA_BYTES {
        return Err(invalid(format!(
            "metadata takes {bytes} bytes as JSON, more than the limit of {MAX_METADATA_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Checks an owner (also as a listing filter).
///
/// # Errors
/// [`Error::InvalidInput`] if empty, longer than [`MAX_OWNER_BYTES`] or
/// holding U+0000.
pub fn check_owner(owner: &str) -> Result<(), Error> {
    check_text("owner", owner, MAX_OWNER_BYTES)
}

/// Checks a metadata key: 1 to [`MAX_METADATA_KEY_BYTES`] bytes of ASCII
/// letters, digits and `_ . - :` (so a key needs no quoting in a JSON path
/// or on a command line).
///
/// # Errors
/// [`Error::InvalidInput`] naming the rule broken.
pub fn check_key(key: &str) -> Result<(), Error> {
    // A long key is echoed cut, so the error stays one readable line.
    let shown = match key.char_indices().nth(60) {
        Some((at, _)) => format!("{:?}…", &key[..at]),
        None => format!("{key:?}"),
    };
    if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES {
        return Err(invalid(format!(
            "metadata key {shown} must have 1 to {MAX_METADATA_KEY_BYTES} bytes, not {}",
            key.len()
        )));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
    {
        return Err(invalid(format!(
            "metadata key {shown} may hold only ASCII letters, digits and _ . - :"
        )));
    }
    Ok(())
}

/// Checks a value a listing matches a metadata key against: a string
/// (without U+0000), a 64-bit signed integer, a boolean or null (a float,
/// a larger integer, an array or an object cannot be matched the same way
/// on every backend).
///
/// # Errors
/// [`Error::InvalidInput`] for any other value.
pub fn check_filter_value(value: &Value) -> Result<(), Error> {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => check_value("filter", value),
        Value::Number(n) if n.is_i64() => Ok(()),
        _ => Err(invalid(
            "a metadata filter matches a string, an integer (64-bit signed), a boolean or null",
        )),
    }
}

/// Where the next page of a listing starts: after the conversation created
/// at `created_at` with `id` (listings are `(created_at, id)` newest first).
/// Shown and parsed as an opaque short string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConversationCursor {
    created_at: i64,
    id: ConversationId,
}

impl ConversationCursor {
    /// The cursor after the conversation `id`, created at `created_at`
    /// (Unix milliseconds).
    pub fn new(created_at: i64, id: ConversationId) -> Self {
        Self { created_at, id }
    }

    /// Unix milliseconds of the last conversation listed.
    pub fn created_at(&self) -> i64 {
        self.created_at
    }

    /// The last conversation listed.
    pub fn id(&self) -> ConversationId {
        self.id
    }
}

impl fmt::Display for ConversationCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}_{}", self.created_at, self.id.as_uuid().simple())
    }
}

impl FromStr for ConversationCursor {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || invalid(format!("{s:?} is not a listing cursor"));
        let (at, id) = s
            .strip_prefix('c')
            .and_then(|rest| rest.split_once('_'))
            .ok_or_else(bad)?;
        let created_at = at.parse::<i64>().map_err(|_| bad())?;
        let uuid = uuid::Uuid::try_parse(id).map_err(|_| bad())?;
        let id = ConversationId::try_from(uuid).map_err(|_| bad())?;
        Ok(Self { created_at, id })
    }
}

impl Serialize for ConversationCursor {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

fn check_text(what: &str, text: &str, max: usize) -> Result<(), Error> {
    if text.is_empty() || text.len() > max {
        return Err(invalid(format!(
            "the {what} must have 1 to {max} bytes, not {}",
            text.len()
        )));
    }
    if text.contains('\0') {
        return Err(invalid(format!("{what} holds U+0000")));
    }
    Ok(())
}

/// No U+0000 anywhere in a value: PostgreSQL's `jsonb` cannot hold it,
/// and both backends keep the same contract.
fn check_value(key: &str, value: &Value) -> Result<(), Error> {
    let clean = match value {
        Value::String(s) => !s.contains('\0'),
        Value::Array(items) => return items.iter().try_for_each(|v| check_value(key, v)),
        Value::Object(map) => {
            for (k, v) in map {
                if k.contains('\0') {
                    return Err(invalid(format!("metadata key {key:?} holds U+0000")));
                }
                check_value(key, v)?;
            }
            true
        }
        _ => true,
    };
    if clean {
        Ok(())
    } else {
        Err(invalid(format!("metadata value of {key:?} holds U+0000")))
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidInput(reason.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn empty() -> ConversationMeta {
        ConversationMeta {
            title: None,
            owner: None,
            metadata: Metadata::new(),
            meta_version: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let id = ConversationId::new();
        let cursor = ConversationCursor::new(1_700_000_000_123, id);
        assert_eq!(
            cursor.to_string().parse::<ConversationCursor>().unwrap(),
            cursor
        );
        for bad in [
            "",
            "c",
            "c12",
            "c12_",
            "cx_00",
            "d1_0123",
            "c1_zz",
            &format!("c1_{}", uuid::Uuid::nil().simple()),
        ] {
            assert!(
                matches!(
                    bad.parse::<ConversationCursor>(),
                    Err(Error::InvalidInput(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn updates_apply_in_order_and_bounds_name_themselves() {
        let mut update = MetaUpdate {
            title: Some(Some("t".into())),
            ..MetaUpdate::default()
        };
        update.set.insert("a".into(), json!(1));
        let next = update.apply(&empty()).unwrap();
        assert_eq!(next.title.as_deref(), Some("t"));
        assert_eq!(next.metadata["a"], json!(1));

        let too_long = MetaUpdate {
            title: Some(Some("x".repeat(MAX_TITLE_BYTES + 1))),
            ..MetaUpdate::default()
        };
        let Err(Error::InvalidInput(why)) = too_long.apply(&empty()) else {
            panic!("a long title passed");
        };
        assert!(why.contains("title must have 1 to 256 bytes"), "{why}");
        assert!(!why.contains("MAX_"), "{why}");

        let mut many = MetaUpdate::default();
        for i in 0..=MAX_METADATA_KEYS {
            many.set.insert(format!("k{i}"), json!(i));
        }
        let Err(Error::InvalidInput(why)) = many.apply(&empty()) else {
            panic!("too many keys passed");
        };
        assert!(why.contains("more than the limit of 64 keys"), "{why}");
        assert!(!why.contains("MAX_"), "{why}");

        let mut big = MetaUpdate::default();
        big.set
            .insert("k".into(), json!("x".repeat(MAX_METADATA_BYTES)));
        let Err(Error::InvalidInput(why)) = big.apply(&empty()) else {
            panic!("a big object passed");
        };
        assert!(why.contains("more than the limit of 8192 bytes"), "{why}");
        assert!(!why.contains("MAX_"), "{why}");

        for key in ["", "a b", "a\"b", &"k".repeat(MAX_METADATA_KEY_BYTES + 1)] {
            let mut bad = MetaUpdate::default();
            bad.set.insert(key.to_owned(), json!(1));
            assert!(bad.apply(&empty()).is_err(), "{key:?}");
        }
        let mut nul = MetaUpdate::default();
        nul.set.insert("k".into(), json!(["a\0"]));
        assert!(nul.apply(&empty()).is_err());
    }

    #[test]
    fn the_builder_makes_the_same_update_as_a_literal() {
        let built = MetaUpdate::default()
            .with_title("t")
            .with_owner_cleared()
            .with_key("a", 1)
            .without_key("b");
        let mut literal = MetaUpdate {
            title: Some(Some("t".into())),
            owner: Some(None),
            unset: vec!["b".into()],
            ..MetaUpdate::default()
        };
        literal.set.insert("a".into(), json!(1));
        assert_eq!(built, literal);
        assert_eq!(
            MetaUpdate::default()
                .with_title_cleared()
                .with_owner("o")
                .apply(&empty())
                .unwrap()
                .owner
                .as_deref(),
            Some("o")
        );
    }

    #[test]
    fn filters_match_only_scalars_every_backend_compares_alike() {
        for ok in [json!("s"), json!(3), json!(true), json!(null)] {
            check_filter_value(&ok).unwrap();
        }
        for bad in [
            json!(1.5),
            json!(u64::MAX),
            json!("a\0"),
            json!([1]),
            json!({"a": 1}),
        ] {
            assert!(check_filter_value(&bad).is_err(), "{bad}");
        }
    }
}
