//! Routing a request to its room by Host and path, the request path's first
//! step. The node has no separate path normalizer yet, so this fuzzes the
//! router itself: any host and path give a room or none, never a panic, and
//! the answer never names a room that does not exist.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use waitroom_edge::{config::EdgeConfig, rooms::RoomTable};

const CONFIG: &str = r#"
[node]
id = "fuzz"
listen = "127.0.0.1:0"

[[rooms]]
id = "shop"
host = "shop.example"
path = "/"
origin = "127.0.0.1:9"
total_active_users = 10
new_users_per_minute = 10

[[rooms]]
id = "drop"
host = "*"
path = "/drops/"
origin = "127.0.0.1:9"
total_active_users = 10
new_users_per_minute = 10

[[rooms]]
id = "all"
host = "*"
path = "/"
origin = "127.0.0.1:9"
total_active_users = 10
new_users_per_minute = 10
"#;

fn table() -> &'static RoomTable {
    static TABLE: OnceLock<RoomTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let config = EdgeConfig::parse(std::path::Path::new("fuzz.toml"), CONFIG)
            .expect("the fixed config parses");
        RoomTable::new(&config.rooms)
    })
}

fuzz_target!(|data: &str| {
    let (host, path) = data.split_once('\n').unwrap_or(("shop.example", data));
    if let Some(i) = table().find(host, path) {
        assert!(i < table().rooms.len());
    }
});
