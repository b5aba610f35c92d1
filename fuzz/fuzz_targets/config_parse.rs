//! Parsing an operator's configuration file: any text is accepted or refused
//! with an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = waitroom_edge::config::EdgeConfig::parse(std::path::Path::new("fuzz.toml"), text);
});
