//! The text each lifecycle enum is stored as: one list per enum, read by
//! every backend and by the command line, so the names cannot drift apart.

/// Implements `as_str` and `parse` for a fieldless enum from one list of
/// `Variant => "name"` pairs.
macro_rules! stored_names {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            /// The name this value is stored and printed as.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }

            /// The value stored as `text`; `None` for an unknown name (a
            /// backend reports that as [`Error::Corrupt`](crate::Error::Corrupt)).
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

pub(crate) use stored_names;
