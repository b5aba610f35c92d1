//! `--check` ⇔ start: a tired operator's table of bad configurations, each
//! refused by `waitroom-edge --check` with exit status 78 (EX_CONFIG) and the
//! field named; and every configuration `--check` accepts here starts a node
//! that prints its ready line. A bad file refused by `--check` is refused by
//! a start the same way (no ready line, status 78), so systemd's
//! `RestartPreventExitStatus=78` stops a restart loop.
use std::{path::Path, process::Command};

use waitroom_tests::{
    edge::Edge,
    procs::{TempDir, binary},
};

/// A complete configuration using every table, its files in `dir`.
fn good(dir: &Path) -> String {
    let certs = dir.join("certs");
    if !certs.exists() {
        waitroom_runtime::devcerts::write(&certs, &["good-node".into()]).unwrap();
        std::fs::write(dir.join("page.html"), "<p>wait {{visitorsAhead}}</p>").unwrap();
    }
    format!(
        r#"[node]
id = "good-node"
colo = "test"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 2
state_dir = "{state}"
header_read_timeout_ms = 5000
keepalive_timeout_ms = 30000
send_timeout_ms = 60000
max_header_bytes = 16384
max_headers = 64
max_connections_per_worker = 1000
shutdown_grace_ms = 1000
ticket_ledger_entries = 65536

[[node.cookie_keys]]
id = 1
secret_hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

[node.tls]
listen = "127.0.0.1:0"
cert = "{cert}"
key = "{key}"

[[rooms]]
id = "shop"
host = "*"
path = "/"
origin = "127.0.0.1:9"
total_active_users = 100
new_users_per_minute = 10
queue_page = "{page}"
ticket_connection_budget = 16
ticket_connection_window_secs = 10
ticket_binding = "network"

[aggregator]
address = "127.0.0.1:9"
server_name = "localhost"
ca = "{ca}"
cert = "{node_cert}"
key = "{node_key}"
interval_ms = 1000
stale_after_ms = 10000
expected_nodes = 3
"#,
        state = dir.join("state").display(),
        cert = certs.join("aggregator.pem").display(),
        key = certs.join("aggregator.key").display(),
        page = dir.join("page.html").display(),
        ca = certs.join("ca.pem").display(),
        node_cert = certs.join("good-node.pem").display(),
        node_key = certs.join("good-node.key").display(),
    )
}

/// Runs `waitroom-edge --check` on `text`; returns (exit code, stderr).
fn check(dir: &Path, text: &str) -> (Option<i32>, String) {
    let path = dir.join("edge.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(binary("waitroom-edge"))
        .args(["--check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `text` with the line starting `key =` replaced by `line` (or appended
/// after the table header `after` when the key is not there).
fn set(text: &str, key: &str, line: &str) -> String {
    let prefix = format!("{key} =");
    let mut found = false;
    let mut out: Vec<String> = text
        .lines()
        .map(|l| {
            if !found && l.starts_with(&prefix) {
                found = true;
                line.to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    assert!(found, "no {key} in the base config");
    out.push(String::new());
    out.join("\n")
}

/// `text` with `extra` inserted right after the first line equal to `header`.
fn add_to(text: &str, header: &str, extra: &str) -> String {
    text.replacen(&format!("{header}\n"), &format!("{header}\n{extra}\n"), 1)
}

#[test]
fn forty_bad_configs_are_refused_naming_the_field_and_good_ones_start() {
    let dir = TempDir::new("check-table");
    let d = dir.path();
    let base = good(d);
    let world_writable = d.join("open");
    std::fs::create_dir_all(&world_writable).unwrap();
    std::fs::set_permissions(
        &world_writable,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let certs = d.join("certs");
    let many_rooms: String = (0..65)
        .map(|i| {
            format!(
                "\n[[rooms]]\nid = \"r{i}\"\npath = \"/r{i}\"\norigin = \"127.0.0.1:9\"\ntotal_active_users = 10\nnew_users_per_minute = 1\n"
            )
        })
        .collect();

    let cases: Vec<(&str, String, &str)> = vec![
        // [node]
        ("empty node id", set(&base, "id", "id = \"\""), "node.id"),
        ("unknown node key", add_to(&base, "[node]", "listen_port = 80"), "listen_port"),
        ("listen not an address", set(&base, "listen", "listen = \"eighty\""), "node.listen"),
        ("100000 workers", set(&base, "workers", "workers = 100000"), "node.workers"),
        ("header timeout 0", set(&base, "header_read_timeout_ms", "header_read_timeout_ms = 0"), "node.header_read_timeout_ms"),
        ("keep-alive 0", set(&base, "keepalive_timeout_ms", "keepalive_timeout_ms = 0"), "node.keepalive_timeout_ms"),
        ("send timeout 0", set(&base, "send_timeout_ms", "send_timeout_ms = 0"), "node.send_timeout_ms"),
        ("max_headers 0", set(&base, "max_headers", "max_headers = 0"), "node.max_headers"),
        ("tiny header bytes", set(&base, "max_header_bytes", "max_header_bytes = 10"), "node.max_header_bytes"),
        ("huge connection limit", set(&base, "max_connections_per_worker", "max_connections_per_worker = 18446744073709551615"), "node.max_connections_per_worker"),
        ("zero connection limit", set(&base, "max_connections_per_worker", "max_connections_per_worker = 0"), "node.max_connections_per_worker"),
        ("grace of a day", set(&base, "shutdown_grace_ms", "shutdown_grace_ms = 86400000"), "node.shutdown_grace_ms"),
        ("negative workers", set(&base, "workers", "workers = -1"), "node.workers"),
        ("new tickets faster than 1 a ms", add_to(&base, "[node]", "new_tickets_per_address_per_minute = 100000"), "node.new_tickets_per_address_per_minute"),
        ("new-ticket burst 0", add_to(&base, "[node]", "new_tickets_burst_per_address = 0"), "node.new_tickets_burst_per_address"),
        ("ticket ledger of 10 entries", set(&base, "ticket_ledger_entries", "ticket_ledger_entries = 10"), "node.ticket_ledger_entries"),
        ("ticket ledger of 2^40 entries", set(&base, "ticket_ledger_entries", "ticket_ledger_entries = 1099511627776"), "node.ticket_ledger_entries"),
        ("non-hex secret", set(&base, "secret_hex", "secret_hex = \"zz0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\""), "secret_hex"),
        ("short secret", set(&base, "secret_hex", "secret_hex = \"0001\""), "secret_hex"),
        ("duplicate key ids", add_to(&base, "[node.tls]", "").replace("[node.tls]", "[[node.cookie_keys]]\nid = 1\nsecret_hex = \"1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100\"\n\n[node.tls]"), "cookie_keys[1].id"),
        ("counters under /proc", add_to(&base, "[node]", "counters_path = \"/proc/waitroom/edge.counters\""), "node.counters_path"),
        ("world-writable state dir", set(&base, "state_dir", &format!("state_dir = \"{}\"", world_writable.display())), "node.state_dir"),
        ("public admin without token", set(&base, "admin_listen", "admin_listen = \"0.0.0.0:0\""), "node.admin_listen"),
        ("token file missing", add_to(&base, "[node]", "admin_token_file = \"/nonexistent/token\""), "admin_token_file"),
        ("trusted proxy /33", add_to(&base, "[node]", "trusted_proxies = [\"127.0.0.1\", \"10.0.0.0/33\"]"), "node.trusted_proxies[1]"),
        ("trusted proxy a name", add_to(&base, "[node]", "trusted_proxies = [\"lb.example\"]"), "node.trusted_proxies[0]"),
        ("PROXY protocol, nobody trusted", add_to(&base, "[node]", "proxy_protocol = true"), "node.proxy_protocol"),
        ("TLS PROXY protocol, nobody trusted", add_to(&base, "[node.tls]", "proxy_protocol = true"), "node.tls.proxy_protocol"),
        ("PROXY protocol not a bool", add_to(&base, "[node]", "proxy_protocol = \"v2\""), "node.proxy_protocol"),
        // [node.tls]
        ("cert file missing", set(&base, "cert", "cert = \"/nonexistent/cert.pem\""), "node.tls"),
        ("key of another cert", set(&base, "key", &format!("key = \"{}\"", certs.join("good-node.key").display())), "node.tls"),
        ("CA as the key", set(&base, "key", &format!("key = \"{}\"", certs.join("ca.pem").display())), "node.tls"),
        // [[rooms]]
        ("no rooms", base.split("[[rooms]]").next().unwrap().to_owned() + &base[base.find("[aggregator]").unwrap()..], "rooms"),
        ("65 rooms", base.clone() + &many_rooms, "rooms"),
        ("unknown room key", add_to(&base, "[[rooms]]", "new_users_per_hour = 5"), "rooms[0].new_users_per_hour"),
        ("lottery", add_to(&base, "[[rooms]]", "queueing_method = \"lottery\""), "rooms[0].queueing_method"),
        ("more new than total", set(&base, "new_users_per_minute", "new_users_per_minute = 1000"), "rooms[0].new_users_per_minute"),
        ("zero total", set(&base, "total_active_users", "total_active_users = 0"), "rooms[0].total_active_users"),
        ("session of 0", add_to(&base, "[[rooms]]", "session_duration = 0"), "rooms[0].session_duration"),
        ("refresh of 1 s", add_to(&base, "[[rooms]]", "refresh_interval = 1"), "rooms[0].refresh_interval"),
        ("queue status 500", add_to(&base, "[[rooms]]", "queue_status = 500"), "rooms[0].queue_status"),
        ("connection budget 100", set(&base, "ticket_connection_budget", "ticket_connection_budget = 100"), "rooms[0].ticket_connection_budget"),
        ("connection window 0", set(&base, "ticket_connection_window_secs", "ticket_connection_window_secs = 0"), "rooms[0].ticket_connection_window_secs"),
        ("binding to the moon", set(&base, "ticket_binding", "ticket_binding = \"moon\""), "rooms[0].ticket_binding"),
        ("path without slash", set(&base, "path", "path = \"drop\""), "rooms[0].path"),
        ("origin not host:port", set(&base, "origin", "origin = \"not a host\""), "rooms[0].origin"),
        ("missing queue page", set(&base, "queue_page", "queue_page = \"/nonexistent/page.html\""), "rooms[0].queue_page"),
        ("duplicate room id", base.clone() + "\n[[rooms]]\nid = \"shop\"\npath = \"/x\"\norigin = \"127.0.0.1:9\"\ntotal_active_users = 10\nnew_users_per_minute = 1\n", "rooms[1].id"),
        // [aggregator]
        ("interval of 10 ms", set(&base, "interval_ms", "interval_ms = 10"), "aggregator.interval_ms"),
        ("stale before two intervals", set(&base, "stale_after_ms", "stale_after_ms = 1500"), "aggregator.stale_after_ms"),
        ("no expected nodes", set(&base, "expected_nodes", "expected_nodes = 0"), "expected_nodes"),
        ("aggregator CA missing", set(&base, "ca", "ca = \"/nonexistent/ca.pem\""), "aggregator"),
        ("aggregator not an address", set(&base, "address", "address = \"aggregator\""), "aggregator.address"),
        // [xdp]
        ("xdp without ports", base.clone() + "\n[xdp]\ninterface = \"veth0\"\n", "xdp"),
        ("xdp mode bogus", base.clone() + "\n[xdp]\ninterface = \"veth0\"\nports = [80]\nmode = \"turbo\"\n", "xdp.mode"),
        ("xdp with no port", base.clone() + "\n[xdp]\ninterface = \"veth0\"\nports = []\n", "xdp.ports"),
        ("xdp SYN budget of 0 a second", base.clone() + "\n[xdp]\ninterface = \"veth0\"\nports = [80]\nsyn_budget = { rate_per_sec = 0, burst = 0 }\n", "xdp.syn_budget.rate_per_sec"),
        ("xdp SYN burst of 0", base.clone() + "\n[xdp]\ninterface = \"veth0\"\nports = [80]\nsyn_budget = { rate_per_sec = 20, burst = 0 }\n", "xdp.syn_budget.burst"),
        ("xdp denies the Internet", base.clone() + "\n[xdp]\ninterface = \"veth0\"\nports = [80]\ndeny = [\"192.0.2.0/24\", \"0.0.0.0/0\"]\n", "xdp.deny[1]"),
    ];
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut problems = Vec::new();
    for (what, text, field) in &cases {
        let (code, err) = check(d, text);
        if code != Some(78) || !err.contains(field) {
            problems.push(format!(
                "{what}: exit {code:?}, expected 78 naming {field:?}: {err}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Every configuration --check accepts here starts a node.
    let accepted = [
        ("everything", base.clone()),
        ("no TLS listener", {
            let start = base.find("[node.tls]").unwrap();
            let end = base.find("[[rooms]]").unwrap();
            format!("{}{}", &base[..start], &base[end..])
        }),
        ("no aggregator", base[..base.find("[aggregator]").unwrap()].to_owned()),
        ("behind a PROXY load balancer", add_to(&add_to(&base, "[node]", "trusted_proxies = [\"127.0.0.1\", \"10.0.0.0/8\", \"2001:db8::/32\"]\nproxy_protocol = true"), "[node.tls]", "proxy_protocol = true")),
        ("defaults", "[node]\nid = \"n\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nstate_dir = \"STATE\"\n\n[[rooms]]\nid = \"shop\"\norigin = \"127.0.0.1:9\"\ntotal_active_users = 10\nnew_users_per_minute = 1\n".replace("STATE", &d.join("state2").display().to_string())),
    ];
    for (what, text) in accepted {
        let (code, err) = check(d, &text);
        assert_eq!(code, Some(0), "{what}: --check refused it: {err}");
        let edge = Edge::start(d, &format!("start-{}", what.replace(' ', "-")), &text)
            .unwrap_or_else(|e| {
                panic!("{what}: --check said ok but the node did not start: {e:#}")
            });
        drop(edge);
    }
}

#[test]
fn a_start_with_a_bad_file_exits_78_without_a_ready_line() {
    let dir = TempDir::new("check-start");
    let d = dir.path();
    let text = set(
        &good(d),
        "queue_page",
        "queue_page = \"/nonexistent/page.html\"",
    );
    let path = d.join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(binary("waitroom-edge"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rooms[0].queue_page"));
}
