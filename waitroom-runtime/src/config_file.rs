//! Reading a TOML configuration file so that every refusal says where: the
//! file, the line and column, and the key path from the top of the file.
//!
//! ```text
//! node.toml:14:19: rooms[0].queueing_method: unknown variant `lottery`, expected one of ...
//! node.toml:12:24: rooms[0].new_users_per_minute: new_users_per_minute (500) is above total_active_users (100)
//! ```
//!
//! Two kinds of refusal pass through here. What serde refuses (a syntax
//! error, an unknown key, a wrong type or variant, a missing key) carries its
//! key path from `serde_path_to_error` and its position from the TOML
//! parser. What a binary refuses afterwards (a range, a duplicate id) names
//! its key path, and [`ConfigText::invalid`] finds that key's position in the
//! text. The person reading the message is an operator at a terminal on
//! launch day: the position takes their editor to the line.
use std::{
    fmt,
    ops::Range,
    path::{Path, PathBuf},
};

use serde::de::DeserializeOwned;

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `key` is empty when the problem is the file's syntax rather than a key.
    #[error("{}{}: {}{problem}", path.display(), At(*at), Key(key))]
    Invalid {
        path: PathBuf,
        /// Where in the file, when the parser knows.
        at: Option<LineColumn>,
        /// Key path from the top of the file: `rooms[0].pools[1].origins`.
        key: String,
        problem: String,
    },
}

impl ConfigError {
    /// The key path the error names (empty for a syntax error or a read error).
    #[must_use]
    pub fn key(&self) -> &str {
        match self {
            Self::Read { .. } => "",
            Self::Invalid { key, .. } => key,
        }
    }
}

/// A position in the file, both counted from 1; the column in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineColumn {
    pub line: usize,
    pub column: usize,
}

struct At(Option<LineColumn>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(LineColumn { line, column }) => write!(f, ":{line}:{column}"),
            None => Ok(()),
        }
    }
}

struct Key<'a>(&'a str);

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, "{}: ", self.0)
        }
    }
}

/// Reads `path` whole.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The text of a configuration file and where it came from.
#[derive(Clone, Copy, Debug)]
pub struct ConfigText<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

impl<'a> ConfigText<'a> {
    #[must_use]
    pub fn new(path: &'a Path, text: &'a str) -> Self {
        Self { path, text }
    }

    /// Deserializes the whole file; a refusal names the key path and position.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        let deserializer = toml::Deserializer::parse(self.text).map_err(|e| {
            self.error(e.span().map(|s| s.start), String::new(), e.message().into())
        })?;
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let (key, problem) = name_the_missing_key(key, inner.message());
            let at = inner
                .span()
                .map(|s| s.start)
                .or_else(|| self.offset_of(&key));
            self.error(at, key, problem)
        })
    }

    /// A refusal of `key` (a path from the top of the file, as
    /// `rooms[0].new_users_per_minute`) found after parsing, at the key's
    /// position in the text: its value, or the nearest enclosing table
    /// written in the file when the key was left at its default.
    pub fn invalid(&self, key: impl Into<String>, problem: impl fmt::Display) -> ConfigError {
        let key = key.into();
        self.error(self.offset_of(&key), key, problem.to_string())
    }

    fn error(&self, offset: Option<usize>, key: String, problem: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_owned(),
            at: offset.map(|offset| line_column(self.text, offset)),
            key,
            problem,
        }
    }

    /// Byte offset of `key`'s value, or of its nearest ancestor in the file.
    fn offset_of(&self, key: &str) -> Option<usize> {
        let root = toml::de::DeTable::parse(self.text).ok()?;
        let mut span: Option<Range<usize>> = None;
        let mut table = Some(root.get_ref());
        for part in key.split('.').filter(|p| !p.is_empty() && *p != "?") {
            let mut indices = part.split('[');
            let name = indices.next().unwrap_or_default();
            let Some(mut entry) = table.and_then(|t| t.get(name)) else {
                break;
            };
            span = Some(entry.span());
            for index in indices {
                let Some(element) = index
                    .trim_end_matches(']')
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| entry.get_ref().as_array()?.get(i))
                else {
                    break;
                };
                entry = element;
                span = Some(entry.span());
            }
            table = entry.get_ref().as_table();
        }
        span.map(|s| s.start)
    }
}

/// serde says "missing field `id`" at the enclosing table; name the key itself.
fn name_the_missing_key(key: String, problem: &str) -> (String, String) {
    let missing = problem
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'));
    match missing {
        Some(field) if key == "." => (field.to_owned(), "missing".to_owned()),
        Some(field) => (format!("{key}.{field}"), "missing".to_owned()),
        None if key == "." => (String::new(), problem.to_owned()),
        None => (key, problem.to_owned()),
    }
}

/// Line and column (from 1, in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> LineColumn {
    let before = &text[..text.floor_char_boundary(offset.min(text.len()))];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    LineColumn {
        line: before.matches('\n').count() + 1,
        column: before[line_start..].chars().count() + 1,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "only parsed, to be refused")]
    struct File {
        name: String,
        #[serde(default)]
        items: Vec<Item>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "only parsed, to be refused")]
    struct Item {
        size: u8,
        #[serde(default)]
        tags: BTreeMap<String, u8>,
    }

    fn refused(text: &str) -> String {
        ConfigText::new(Path::new("f.toml"), text)
            .parse::<File>()
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn serde_refusals_carry_the_key_path_and_position() {
        assert_eq!(
            refused("name = \"x\"\n[[items]]\nsize = 1\n[[items]]\nsize = 300\n"),
            "f.toml:5:8: items[1].size: invalid value: integer `300`, expected u8"
        );
        let unknown = refused("name = \"x\"\n[[items]]\nsize = 1\ncolour = 2\n");
        assert!(
            unknown.starts_with("f.toml:4:1: items[0].colour: unknown field `colour`"),
            "{unknown}"
        );
        assert_eq!(
            refused("name = \"x\"\n[[items]]\ntags = {}\n"),
            "f.toml:2:1: items[0].size: missing"
        );
        assert_eq!(
            refused("[[items]]\nsize = 1\n"),
            "f.toml:1:1: name: missing"
        );
    }

    #[test]
    fn syntax_errors_carry_the_position_without_a_key() {
        assert_eq!(
            refused("name = \"x\"\nsize 1\n"),
            "f.toml:2:6: key with no value, expected `=`"
        );
    }

    #[test]
    fn later_refusals_find_the_key_or_its_table() {
        let text = "name = \"x\"\n[[items]]\nsize = 1\n[[items]]\nsize = 2\n";
        let file = ConfigText::new(Path::new("f.toml"), text);
        assert_eq!(
            file.invalid("items[1].size", "too big").to_string(),
            "f.toml:5:8: items[1].size: too big"
        );
        // A key left at its default: the table it belongs in.
        assert_eq!(
            file.invalid("items[1].tags", "needed").to_string(),
            "f.toml:4:1: items[1].tags: needed"
        );
        assert_eq!(
            file.invalid("other", "missing").to_string(),
            "f.toml: other: missing"
        );
    }

    #[test]
    fn columns_count_characters() {
        assert_eq!(
            line_column("a = \"é\"\nb = 1", 11),
            LineColumn { line: 2, column: 3 }
        );
    }
}
