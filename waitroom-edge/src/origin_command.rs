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

    /// Removes the header from a visitor's request: only the origin speaks it.
    pub fn strip_request(&self, headers: &mut HeaderMap) {
        headers.remove(&self.header);
    }

    /// Removes the header from the origin's response and returns the
    /// allowed command it gave, if any (values are comma-separated tokens,
    /// ASCII case-insensitive).
    pub fn take(&self, headers: &mut HeaderMap) -> Option<OriginCommand> {
        let revoke = headers.get_all(&self.header).iter().any(|value| {
            value
                .to_str()
                .unwrap_or_default()
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(OriginCommand::Revoke.token()))
        });
        // Every value goes (`remove` drops them all).
        headers.remove(&self.header);
        (revoke && self.revoke).then_some(OriginCommand::Revoke)
    }
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
}
