//! An origin's answer head as the node passes it to a visitor
//! (`waitroom_edge::origin_h1`): any bytes give a head the node refuses or
//! reads, never a panic; and where its fields go to the visitor as lines
//! copied from the head, those lines are exactly what the map path gives
//! (the same values under the same names, in the same order per name,
//! `Content-Length` aside), each line a valid field (so hyper's path, which
//! puts them in a map, loses none), with no field of the origin's hop and
//! none of the room's origin-command field, whose values are kept aside.
#![no_main]

use http::HeaderName;
use libfuzzer_sys::fuzz_target;
use waitroom_edge::origin_h1::{check_lines_against_map, fields_both_ways};

fuzz_target!(|data: &[u8]| {
    // The room's command field: the fuzzer reaches it by spelling it.
    let command = HeaderName::from_static("waitroom-command");
    let Some((Some(lines), map)) = fields_both_ways(data, Some(&command)) else {
        return;
    };
    if let Err(broken) = check_lines_against_map(data, Some(&command), &lines, map) {
        panic!("{broken}");
    }
});
