//! Closed sets of named values: the [`Choice`] trait and the [`choice!`] macro that implements it,
//! `FromStr` and `Display` for an enum of unit variants. On the ground floor, so that any layer can
//! name its choices (the configuration's, a method's target, a figure's statistic) without
//! importing another.

/// A value from a closed set of named values.
pub trait Choice: Copy + PartialEq + Send + Sync + 'static {
    /// Every value, in the order help lists them.
    const ALL: &'static [Self];

    /// The value's name: its spelling on the command line and (serde) in manifest.json.
    fn name(self) -> &'static str;

    /// What the value means, one paragraph (empty: the value is listed without help).
    fn help(self) -> &'static str;

    /// The value named `name`, if any (names are case-sensitive).
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }

    /// Every name, in the order help lists them.
    fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|v| v.name()).collect()
    }
}

/// Implements [`Choice`], `FromStr` (a [`crate::UsageError`] naming the choices) and `Display`
/// (the name) for an enum of unit variants: `choice!(Enum { Variant = "name" ["help"], … })`.
macro_rules! choice {
    ($ty:ty { $($variant:ident = $name:literal $($help:literal)?),+ $(,)? }) => {
        impl $crate::choice::Choice for $ty {
            const ALL: &'static [Self] = &[$(Self::$variant),+];

            fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name),+
                }
            }

            fn help(self) -> &'static str {
                match self {
                    $(Self::$variant => concat!("" $(, $help)?)),+
                }
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $crate::UsageError;

            fn from_str(s: &str) -> ::std::result::Result<Self, Self::Err> {
                use $crate::choice::Choice;
                Self::from_name(s).ok_or_else(|| {
                    $crate::UsageError(format!(
                        "'{s}': expected one of {}",
                        Self::names().join(", ")
                    ))
                })
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str($crate::choice::Choice::name(*self))
            }
        }
    };
}
pub(crate) use choice;
