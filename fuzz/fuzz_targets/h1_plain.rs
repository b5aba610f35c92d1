//! The node's own HTTP/1 exchange deciding what it serves itself
//! (`waitroom_edge::http::h1`): any bytes give "hyper's" or a plain request,
//! never a panic; and whatever it calls plain is what the exchange promises
//! to serve and nothing more: a `GET` or `HEAD` of HTTP/1.1 in origin form,
//! with no length, coding, upgrade or expectation, `Connection` at most
//! `keep-alive`/`close`, a head as long as httparse says and within the
//! limits. Everything else (a body to frame, a smuggler's pair) is hyper's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use waitroom_edge::http::h1::{Limits, plain_request};

const LIMITS: Limits = Limits {
    max_header_bytes: 4096,
    max_headers: 32,
};

fuzz_target!(|data: &[u8]| {
    let Some((len, req)) = plain_request(data, LIMITS) else {
        return;
    };
    assert!(len <= data.len() && len <= LIMITS.max_header_bytes);
    // httparse, asked again with room for every field, agrees on the head.
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut slots);
    assert_eq!(
        parsed.parse(data).ok(),
        Some(httparse::Status::Complete(len)),
        "a head httparse does not see the same way"
    );
    assert!(matches!(parsed.method, Some("GET" | "HEAD")));
    assert_eq!(parsed.version, Some(1));
    assert!(parsed.path.is_some_and(|p| p.starts_with('/')));
    assert!(parsed.headers.len() <= LIMITS.max_headers);
    for h in parsed.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        assert!(
            !matches!(
                name.as_str(),
                "content-length" | "transfer-encoding" | "upgrade" | "expect"
            ),
            "served a request with {name}"
        );
        if name == "connection" {
            for token in h.value.split(|b| *b == b',') {
                let token = token.trim_ascii().to_ascii_lowercase();
                assert!(
                    token.is_empty() || token == b"keep-alive" || token == b"close",
                    "served Connection: {:?}",
                    String::from_utf8_lossy(h.value)
                );
            }
        }
    }
    // What the handler would get says the same.
    if let Some(req) = req {
        assert_eq!(req.method().as_str(), parsed.method.unwrap());
        assert_eq!(req.version(), http::Version::HTTP_11);
        assert_eq!(req.headers().len(), parsed.headers.len());
        assert!(req.uri().path().starts_with('/'));
    }
});
