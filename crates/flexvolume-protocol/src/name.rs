//! Driver names: `vendor/driver` in volume specs, `vendor~driver` on disk.
//!
//! Names come from users (volume specs, CLI) and from whatever is in the plugin dir, so they are
//! validated before any path is built from them: a name can never climb out of the plugin dir,
//! look like a command-line flag, or hide as a dot-file.

use std::fmt;

/// Longest accepted name, in bytes (a DNS subdomain's limit, which keeps names usable as CSI
/// driver names and socket directory names).
pub const MAX_NAME_LEN: usize = 253;

/// Why a driver name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("driver name is empty")]
    Empty,
    #[error("driver name is {len} bytes long; at most {MAX_NAME_LEN} are allowed")]
    TooLong { len: usize },
    #[error("driver name {name:?} has an empty segment (leading, trailing or doubled '/')")]
    EmptySegment { name: String },
    #[error("driver name {name:?} has a segment starting with '.' (dot-names are invisible to the prober)")]
    DotSegment { name: String },
    #[error("driver name {name:?} has a segment starting with '-' (it would read as a flag)")]
    DashSegment { name: String },
    #[error("driver name {name:?} contains {ch:?}; only A-Z a-z 0-9 . _ - and '/' between segments are allowed")]
    BadChar { name: String, ch: char },
}

/// A validated driver name such as `k8s.io/nfs` or `nfs`.
///
/// Invariant: 1–253 bytes, `/`-separated segments of `[A-Za-z0-9._-]`, no empty segment, no
/// segment starting with `.` or `-` (which also rules out `.` and `..`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DriverName(String);

impl DriverName {
    /// Validates a name as written in a volume spec (`vendor/driver`).
    pub fn parse(name: &str) -> Result<Self, NameError> {
        validate(name)?;
        Ok(Self(name.to_owned()))
    }

    /// Derives the name from a plugin-dir entry (`vendor~driver`): every `~` becomes `/`.
    pub fn from_dir_name(dir_name: &str) -> Result<Self, NameError> {
        Self::parse(&dir_name.replace('~', "/"))
    }

    /// The directory name inside the plugin dir (`vendor~driver`).
    pub fn dir_name(&self) -> String {
        self.0.replace('/', "~")
    }

    /// The executable's file name: the last segment.
    pub fn executable_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DriverName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for DriverName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl serde::Serialize for DriverName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

fn validate(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong { len: name.len() });
    }
    for segment in name.split('/') {
        let owned = || name.to_owned();
        match segment.chars().next() {
            None => return Err(NameError::EmptySegment { name: owned() }),
            Some('.') => return Err(NameError::DotSegment { name: owned() }),
            Some('-') => return Err(NameError::DashSegment { name: owned() }),
            Some(_) => {}
        }
        if let Some(ch) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(NameError::BadChar { name: owned(), ch });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_and_driver_map_to_dir_and_executable() {
        let n = DriverName::parse("k8s.io/nfs").unwrap();
        assert_eq!(n.dir_name(), "k8s.io~nfs");
        assert_eq!(n.executable_name(), "nfs");
        let n = DriverName::from_dir_name("foo~cifs").unwrap();
        assert_eq!(n.as_str(), "foo/cifs");
        let n = DriverName::from_dir_name("nfs").unwrap();
        assert_eq!((n.as_str(), n.executable_name()), ("nfs", "nfs"));
        let n = DriverName::from_dir_name("a~b~c").unwrap();
        assert_eq!((n.as_str(), n.executable_name()), ("a/b/c", "c"));
    }

    #[test]
    fn hostile_names_are_refused_with_the_reason() {
        let long = "a".repeat(300);
        type Check = fn(&NameError) -> bool;
        let cases: &[(&str, Check)] = &[
            ("", |e| matches!(e, NameError::Empty)),
            ("../x", |e| matches!(e, NameError::DotSegment { .. })),
            ("a/../b", |e| matches!(e, NameError::DotSegment { .. })),
            ("..", |e| matches!(e, NameError::DotSegment { .. })),
            (".hidden", |e| matches!(e, NameError::DotSegment { .. })),
            ("a//b", |e| matches!(e, NameError::EmptySegment { .. })),
            ("/abs", |e| matches!(e, NameError::EmptySegment { .. })),
            ("trailing/", |e| matches!(e, NameError::EmptySegment { .. })),
            ("-rf", |e| matches!(e, NameError::DashSegment { .. })),
            ("v/-rf", |e| matches!(e, NameError::DashSegment { .. })),
            ("a\0b", |e| matches!(e, NameError::BadChar { ch: '\0', .. })),
            ("a b", |e| matches!(e, NameError::BadChar { ch: ' ', .. })),
            ("a~b", |e| matches!(e, NameError::BadChar { ch: '~', .. })),
            ("a\\b", |e| matches!(e, NameError::BadChar { .. })),
            ("a$(x)", |e| matches!(e, NameError::BadChar { .. })),
            ("café", |e| matches!(e, NameError::BadChar { .. })),
            ("a\nb", |e| matches!(e, NameError::BadChar { .. })),
            (&long, |e| matches!(e, NameError::TooLong { len: 300 })),
        ];
        for (input, expected) in cases {
            let err = DriverName::parse(input).expect_err(input);
            assert!(expected(&err), "{input:?} gave {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn dir_names_with_traversal_are_refused() {
        assert!(DriverName::from_dir_name("..~x").is_err());
        assert!(DriverName::from_dir_name("~x").is_err());
        assert!(DriverName::from_dir_name("x~").is_err());
    }

    #[test]
    fn longest_name_is_accepted() {
        let name = "a".repeat(MAX_NAME_LEN);
        assert!(DriverName::parse(&name).is_ok());
    }
}
