//! [`named_enum!`]: fieldless enums whose variants each have one name, used
//! in config files and on the command line.

/// Declares a fieldless enum whose every variant has one name, and derives
/// from the one list of names: `ALL` (every variant, in the order of the
/// names), `NAMES` (the names, comma separated), `as_str`, `Display` and a
/// `FromStr` that trims, ignores case and, for an unknown name, returns
/// [`crate::OptimError::UnknownName`] listing the accepted ones.
///
/// ```
/// slowmo_optim::named_enum! {
///     /// A colour.
///     #[derive(Debug, Clone, Copy, PartialEq, Eq)]
///     pub enum Colour: "colour" {
///         /// Red.
///         Red = "red",
///         DarkBlue = "dark-blue",
///     }
/// }
/// assert_eq!(" Dark-Blue".parse::<Colour>().unwrap(), Colour::DarkBlue);
/// assert_eq!(Colour::ALL.map(Colour::as_str), ["red", "dark-blue"]);
/// let e = "green".parse::<Colour>().unwrap_err().to_string();
/// assert!(e.contains("\"green\"") && e.contains("red, dark-blue"), "{e}");
/// ```
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $what:literal {
            $(#[$first_meta:meta])* $first:ident = $first_name:literal
            $(, $(#[$variant_meta:meta])* $variant:ident = $variant_name:literal)* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $(#[$first_meta])* $first,
            $($(#[$variant_meta])* $variant,)*
        }

        impl $name {
            /// Every variant, in the order of the accepted names.
            pub const ALL: [Self; <[&str]>::len(&[$first_name $(, $variant_name)*])] =
                [Self::$first $(, Self::$variant)*];

            /// The accepted names, comma separated.
            pub const NAMES: &'static str = concat!($first_name $(, ", ", $variant_name)*);

            /// The name used in configs and on the command line.
            pub fn as_str(self) -> &'static str {
                match self {
                    Self::$first => $first_name,
                    $(Self::$variant => $variant_name,)*
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::OptimError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let wanted = s.trim().to_ascii_lowercase();
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == wanted)
                    .ok_or_else(|| $crate::OptimError::UnknownName {
                        what: $what,
                        given: s.to_string(),
                        expected: Self::NAMES,
                    })
            }
        }
    };
}
