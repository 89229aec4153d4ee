//! Enums whose values have names: the spelling a command line, a manifest
//! or a report uses. The library's enums know nothing of the command line;
//! `cli` turns `ALL`, `name` and `doc` into clap's possible values.

/// Define an enum whose values are named: `ALL` (every value, in order),
/// `name()`, `doc()` (the value's doc comment, line by line), `Display` and
/// `FromStr` (an unknown name is an error listing the known ones). Serde
/// attributes stay the caller's and must spell the same names.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $t:ident {
            $( $(#[doc = $doc:literal])* $v:ident = $n:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $t {
            $( $(#[doc = $doc])* $v ),*
        }

        impl $t {
            /// Every value, in order.
            pub const ALL: &'static [$t] = &[$($t::$v),*];

            /// The value's name.
            pub fn name(self) -> &'static str {
                match self {
                    $($t::$v => $n),*
                }
            }

            /// The value's doc comment, one entry per line.
            pub fn doc(self) -> &'static [&'static str] {
                match self {
                    $($t::$v => &[$($doc),*]),*
                }
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.name())
            }
        }

        impl std::str::FromStr for $t {
            type Err = $crate::error::UnknownName;

            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                Self::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| {
                    $crate::error::UnknownName {
                        name: s.to_string(),
                        expected: Self::ALL.iter().map(|v| v.name()).collect(),
                    }
                })
            }
        }
    };
}

pub(crate) use named_enum;

#[cfg(test)]
mod tests {
    named_enum! {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Shade {
            /// Dark,
            /// very.
            Dark = "dark",
            LightGrey = "light-grey",
        }
    }

    #[test]
    fn names_parse_back_and_unknown_names_list_the_known() {
        for s in Shade::ALL {
            assert_eq!(s.name().parse::<Shade>(), Ok(*s));
            assert_eq!(s.to_string(), s.name());
        }
        assert_eq!(Shade::Dark.doc(), [" Dark,", " very."]);
        assert!(Shade::LightGrey.doc().is_empty());
        let e = "grey".parse::<Shade>().unwrap_err();
        assert_eq!(
            e,
            crate::error::UnknownName {
                name: "grey".into(),
                expected: vec!["dark", "light-grey"]
            }
        );
        assert_eq!(e.to_string(), "`grey`: expected one of dark, light-grey");
    }
}
