//! Identifiers: UUID newtypes and the validated tenant [`Namespace`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::Error;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $what:literal, $new:expr) => {
        $(#[$doc])*
        ///
        /// Decoding (serde) refuses the nil UUID, as [`Self::from_uuid`] does.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh, time-ordered id (UUID v7): a millisecond timestamp,
            /// then random bits (ordered within the process), so an id tells
            /// when it was made. Rows keyed by ids made one after another
            /// then land side by side in the stores' indexes, not on a random
            /// page each.
            #[allow(clippy::new_without_default)]
            pub fn new() -> Self {
                Self($new)
            }

            /// Wraps an existing UUID.
            ///
            /// # Errors
            /// [`Error::InvalidInput`] for the nil UUID, which is never a valid id.
            pub fn from_uuid(uuid: Uuid) -> Result<Self, Error> {
                if uuid.is_nil() {
                    return Err(Error::InvalidInput(format!("{} must not be the nil uuid", $what)));
                }
                Ok(Self(uuid))
            }

            /// The UUID inside.
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }

        }

        impl TryFrom<Uuid> for $name {
            type Error = Error;

            /// [`Self::from_uuid`].
            fn try_from(uuid: Uuid) -> Result<Self, Error> {
                Self::from_uuid(uuid)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(s: &str) -> Result<Self, Error> {
                let uuid = Uuid::parse_str(s).map_err(|e| {
                    Error::InvalidInput(format!("{} {s:?} is not a uuid: {e}", $what))
                })?;
                Self::from_uuid(uuid)
            }
        }

        // Not derived: `#[serde(transparent)]` would skip the nil check.
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let uuid = Uuid::deserialize(d)?;
                Self::from_uuid(uuid).map_err(serde::de::Error::custom)
            }
        }
    };
}

uuid_id!(
    /// A conversation: an append-only transcript with one admission.
    ConversationId,
    "conversation id",
    Uuid::now_v7()
);
uuid_id!(
    /// The caller-chosen idempotency key of one user input.
    RequestId,
    "request id",
    Uuid::now_v7()
);
uuid_id!(
    /// One execution attempt of a request. A fresh one is time-ordered
    /// (UUID v7); a request's first run carries the request's own id
    /// ([`RunId::first_of`]).
    RunId,
    "run id",
    Uuid::now_v7()
);

impl RunId {
    /// The id of `request`'s first run: the request's own id. A store may
    /// keep such a run in the request's own row (SQLite does), so a request
    /// that runs once writes one row for its bookkeeping.
    pub fn first_of(request: RequestId) -> Self {
        Self(request.as_uuid())
    }
}

/// Tenant / isolation scope: 1–128 bytes of `[A-Za-z0-9_.-]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Namespace(String);

impl Namespace {
    /// The longest namespace accepted, in bytes.
    pub const MAX_LEN: usize = 128;

    /// The name of the namespace used when none is chosen: the command
    /// line's `--namespace` default on every command that needs one, and
    /// [`Namespace::default`].
    pub const DEFAULT: &'static str = "default";

    /// Validates a namespace.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when it is empty, longer than 128 bytes or has a
    /// byte outside `[A-Za-z0-9_.-]`.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        if name.is_empty() || name.len() > Self::MAX_LEN {
            return Err(Error::InvalidInput(format!(
                "namespace must be 1-{} bytes, got {}",
                Self::MAX_LEN,
                name.len()
            )));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            return Err(Error::InvalidInput(format!(
                "namespace may hold only [A-Za-z0-9_.-], found {bad:?}"
            )));
        }
        Ok(Self(name))
    }

    /// The namespace as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Namespace {
    /// The namespace named [`Namespace::DEFAULT`].
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}
impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Namespace {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Self::new(s)
    }
}

impl<'de> Deserialize<'de> for Namespace {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::new(raw).map_err(serde::de::Error::custom)
    }
}

/// The admission's compare-and-swap counter. It moves by one on every
/// ownership change (claim, recovery, commit, abandon).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Revision(pub u64);

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
