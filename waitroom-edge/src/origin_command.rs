//! Origin commands: a response header in which the origin tells the room
//! something about the visitor of that response (Cloudflare's
//! `enabled_origin_commands`; today `revoke`: the checkout is done, end the
//! session and free the slot).
//!
//! The header (`origin_command_header`, `waitroom-command` by default) is the
//! origin's word to the node, never the visitor's: it is removed from the
//! visitor's request before the origin sees it (so an origin that echoes
//! request headers cannot be made to say it) and from every response before
//! the visitor sees it, whether the room allows the command or not.
use http::{HeaderMap, HeaderName};

use crate::http::h1::HeadLines;
use waitroom_common::room_table::{DEFAULT_ORIGIN_COMMAND_HEADER, OriginCommand};

/// A room's command header and which commands it follows.
#[derive(Debug, Clone)]
pub struct OriginCommands {
    header: HeaderName,
    revoke: bool,
}

impl Default for OriginCommands {
    fn default() -> Self {
        Self {
            header: HeaderName::from_static(DEFAULT_ORIGIN_COMMAND_HEADER),
            revoke: false,
        }
    }
}

impl OriginCommands {
    /// From the room settings; a header name that is not one (validated
    /// already) falls back to the default rather than stripping nothing.
    #[must_use]
    pub fn new(header: &str, enabled: &[OriginCommand]) -> Self {
        Self {
            header: HeaderName::from_bytes(header.as_bytes())
                .unwrap_or(HeaderName::from_static(DEFAULT_ORIGIN_COMMAND_HEADER)),
            revoke: enabled.contains(&OriginCommand::Revoke),
        }
    }

    /// The header's name.
    #[must_use]
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// Removes the header from a visitor's request: only the origin speaks it.
    pub fn strip_request(&self, headers: &mut HeaderMap) {
        headers.remove(&self.header);
    }

    /// Removes the header from the origin's response and returns the
    /// allowed command it gave, if any (values are comma-separated tokens,
    /// ASCII case-insensitive).
    pub fn take(&self, headers: &mut HeaderMap) -> Option<OriginCommand> {
        let revoke = says_revoke(headers.get_all(&self.header).iter().map(|v| v.as_bytes()));
        // Every value goes (`remove` drops them all).
        headers.remove(&self.header);
        (revoke && self.revoke).then_some(OriginCommand::Revoke)
    }

    /// [`OriginCommands::take`] for an answer whose fields came as lines
    /// (`h1::HeadLines`, a plain-HTTP origin's), from which the header was
    /// left out as they were copied ([`HeadLines::take_commands`]: the
    /// origin was asked with [`OriginCommands::header`]).
    pub fn take_lines(&self, lines: &mut HeadLines) -> Option<OriginCommand> {
        let values = lines.take_commands();
        let revoke = says_revoke(values.iter().map(Vec::as_slice));
        (revoke && self.revoke).then_some(OriginCommand::Revoke)
    }
}

/// Whether one of `values` holds the `revoke` token (values are
/// comma-separated tokens, ASCII case-insensitive; a value that is not
/// visible ASCII holds none, as `HeaderValue::to_str` refuses it).
fn says_revoke<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> bool {
    values.any(|value| {
        value
            .iter()
            .all(|b| *b == b'\t' || (b' '..0x7f).contains(b))
            && value.split(|b| *b == b',').any(|t| {
                t.trim_ascii()
                    .eq_ignore_ascii_case(OriginCommand::Revoke.token().as_bytes())
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn an_allowed_command_is_taken_and_the_header_always_goes() {
        let allowed = OriginCommands::new("Waitroom-Command", &[OriginCommand::Revoke]);
        let mut h = HeaderMap::new();
        h.append("waitroom-command", HeaderValue::from_static("noop"));
        h.append("waitroom-command", HeaderValue::from_static("x, Revoke"));
        assert_eq!(allowed.take(&mut h), Some(OriginCommand::Revoke));
        assert!(h.is_empty());

        let not_allowed = OriginCommands::new("waitroom-command", &[]);
        let mut h = HeaderMap::new();
        h.insert("waitroom-command", HeaderValue::from_static("revoke"));
        assert_eq!(not_allowed.take(&mut h), None);
        assert!(h.is_empty(), "stripped even when not allowed");

        let renamed = OriginCommands::new("x-shop-command", &[OriginCommand::Revoke]);
        let mut h = HeaderMap::new();
        h.insert("waitroom-command", HeaderValue::from_static("revoke"));
        assert_eq!(renamed.take(&mut h), None, "only the configured header");
        let mut req = HeaderMap::new();
        req.insert("x-shop-command", HeaderValue::from_static("revoke"));
        renamed.strip_request(&mut req);
        assert!(req.is_empty());
    }

    /// An origin's answer read as lines gives the command the map gives,
    /// and its lines keep what the map keeps: over values with the token
    /// in odd spellings and places, or not quite the token, and names that
    /// only start like the header or sit in its value.
    #[test]
    fn lines_give_the_same_command_and_keep_the_same_fields() {
        const VALUES: [&[u8]; 9] = [
            b"revoke",
            b"REVOKE",
            b"x,\t revoke ,y",
            b"revoked",
            b"re voke",
            b"",
            b"caf\xe9, revoke",
            b"noop",
            b"waitroom-command: revoke",
        ];
        const NAMES: [&str; 4] = [
            "Waitroom-Command",
            "waitroom-command-x",
            "x-waitroom-command",
            "waitroom-comman",
        ];
        let commands = [
            OriginCommands::new("waitroom-command", &[OriginCommand::Revoke]),
            OriginCommands::new("Waitroom-Command", &[]),
        ];
        let mut cases = 0;
        for command in &commands {
            for (i, a) in VALUES.iter().enumerate() {
                for (j, b) in VALUES.iter().enumerate() {
                    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
                    for (name, value) in [
                        (NAMES[i % 4], *a),
                        ("x-other", b"1".as_slice()),
                        (NAMES[j % 4], *b),
                        (NAMES[0], *b),
                    ] {
                        head.extend_from_slice(name.as_bytes());
                        head.extend_from_slice(b": ");
                        head.extend_from_slice(value);
                        head.extend_from_slice(b"\r\n");
                    }
                    head.extend_from_slice(b"\r\n");
                    let (lines, mut map) =
                        crate::origin_h1::fields_both_ways(&head, Some(command.header())).unwrap();
                    let mut lines = HeadLines::from_origin(lines.unwrap());
                    assert_eq!(command.take_lines(&mut lines), command.take(&mut map));
                    let mut kept: Vec<Vec<u8>> = Vec::new();
                    for (name, value) in &map {
                        kept.push([name.as_str().as_bytes(), b": ", value.as_bytes()].concat());
                    }
                    let mut left: Vec<Vec<u8>> = lines
                        .as_bytes()
                        .split(|b| *b == b'\n')
                        .filter(|l| !l.is_empty())
                        .map(|l| {
                            // Names compared in lower case, as the map has them.
                            let mut l = l.strip_suffix(b"\r").unwrap().to_vec();
                            let colon = l.iter().position(|b| *b == b':').unwrap();
                            l[..colon].make_ascii_lowercase();
                            l
                        })
                        .collect();
                    left.sort_unstable();
                    kept.sort_unstable();
                    assert_eq!(left, kept);
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 2 * 9 * 9);
    }
}
