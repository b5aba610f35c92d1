//! The one response body type: local pages and streamed origin bodies alike.
use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::UnsyncBoxBody};

/// Errors carried inside response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every response body a waitroom binary sends.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A complete in-memory body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}
