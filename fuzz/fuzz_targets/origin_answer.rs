//! An origin's answer head as the node passes it to a visitor
//! (`waitroom_edge::origin_h1`): any bytes give a head the node refuses or
//! reads, never a panic; and where its fields go to the visitor as lines
//! copied from the head, those lines are exactly what the map path gives
//! (the same values under the same names, in the same order per name,
//! `Content-Length` aside), each line a valid field (so hyper's path, which
//! puts them in a map, loses none), with no field of the origin's hop and
//! none of the room's origin-command field, whose values are kept aside.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use waitroom_edge::origin_h1::{OriginLines, fields_both_ways};

/// Fields that never reach a visitor from the lines.
const HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

fuzz_target!(|data: &[u8]| {
    // The room's command field: the fuzzer reaches it by spelling it.
    let command = HeaderName::from_static("waitroom-command");
    let Some((lines, mut map)) = fields_both_ways(data, Some(&command)) else {
        return;
    };
    let Some(OriginLines {
        lines,
        date,
        commands,
    }) = lines
    else {
        return;
    };
    let said: Vec<&[u8]> = map.get_all(&command).iter().map(|v| v.as_bytes()).collect();
    assert_eq!(commands, said, "the command's values, kept aside");
    map.remove(&command);
    let mut from_lines = HeaderMap::new();
    {
        for line in lines.split_inclusive(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r\n").expect("lines end in CR LF");
            let colon = line.iter().position(|b| *b == b':').expect("name: value");
            let name = HeaderName::from_bytes(&line[..colon]).expect("a valid name");
            assert_eq!(&line[colon + 1..colon + 2], b" ");
            let value = HeaderValue::from_bytes(&line[colon + 2..]).expect("a valid value");
            assert!(!HOP.contains(&name.as_str()), "{name} passed");
            assert_ne!(name, command, "the command field passed");
            from_lines.append(name, value);
        }
    }
    assert_eq!(date, from_lines.contains_key(http::header::DATE));
    assert_eq!(from_lines.len(), map.len(), "as many fields");
    for name in map.keys() {
        let a: Vec<_> = from_lines.get_all(name).iter().collect();
        let b: Vec<_> = map.get_all(name).iter().collect();
        assert_eq!(a, b, "{name}");
    }
});
