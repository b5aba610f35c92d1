//! The node as a careful operator and a hostile neighbour see it (issue 14,
//! items 5 and 6), with the real binary: the admin listener's token rules,
//! `--check` refusing an exposed admin listener, a silent admin client cut
//! off, a planted cookie key refused at start, and a counters file truncated
//! under a running node.
use std::{
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use waitroom_tests::{
    edge::{Edge, SITE, client, get},
    procs::{Proc, TempDir, binary, start_origin},
};

const TOKEN: &str = "4f1c0ffee0ddba11deadbeefcafe1234";

/// A node config with one room; `node` adds keys to `[node]`.
fn config(dir: &Path, origin: SocketAddr, node: &str) -> String {
    format!(
        r#"[node]
id = "hardening"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
workers = 1
state_dir = "{state}"
{node}

[[rooms]]
id = "shop"
origin = "{origin}"
total_active_users = 1000
new_users_per_minute = 1000
"#,
        state = dir.join("state").display()
    )
}

fn write_token(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("admin.token");
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn check(dir: &Path, name: &str, text: &str) -> std::process::Output {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    Command::new(binary("waitroom-edge"))
        .arg("--check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap()
}

fn deny(edge: &Edge, method: &str, query: &str, token: Option<&str>) -> (u16, String) {
    let url = edge.admin_url(&format!("/deny?{query}"));
    let agent = client();
    let mut req = match method {
        "POST" => agent.post(&url),
        _ => agent.delete(&url).force_send_body(),
    };
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut resp = req.send_empty().unwrap();
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

#[test]
fn changing_the_deny_list_needs_the_token() {
    let dir = TempDir::new("admin-token");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();

    // No token file: reading works on loopback, changing is refused outright.
    let edge = Edge::start(dir.path(), "edge", &config(dir.path(), origin, "")).unwrap();
    assert_eq!(get(&client(), &edge.admin_url("/metrics")).0, 200);
    let (status, body) = deny(&edge, "POST", "prefix=192.0.2.0/24", Some(TOKEN));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("admin_token_file"), "{body}");
    drop(edge);

    let token = write_token(dir.path());
    let cfg = config(
        dir.path(),
        origin,
        &format!("admin_token_file = \"{}\"", token.display()),
    );
    let edge = Edge::start(dir.path(), "edge-token", &cfg).unwrap();
    for (method, token) in [
        ("POST", None),
        ("POST", Some("wrong-token-wrong-token")),
        ("POST", Some(&TOKEN[..TOKEN.len() - 1])),
        ("DELETE", None),
        ("DELETE", Some("4f1c0ffee0ddba11deadbeefcafe1235")),
    ] {
        let (status, body) = deny(&edge, method, "prefix=192.0.2.0/24", token);
        assert_eq!(status, 401, "{method} with {token:?}: {body}");
    }
    // The right token gets past the check: this node has no XDP program,
    // so the answer is that, not 401.
    let (status, body) = deny(&edge, "POST", "prefix=192.0.2.0/24", Some(TOKEN));
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("XDP"), "{body}");
    // Reading on loopback needs no token.
    assert_eq!(get(&client(), &edge.admin_url("/status")).0, 200);
}

#[test]
fn check_refuses_an_admin_listener_off_loopback_without_a_token() {
    let dir = TempDir::new("admin-exposed");
    let origin: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let exposed = config(dir.path(), origin, "").replace(
        "admin_listen = \"127.0.0.1:0\"",
        "admin_listen = \"0.0.0.0:0\"",
    );
    let out = check(dir.path(), "exposed", &exposed);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--check accepted it: {stderr}");
    assert!(
        stderr.contains("node.admin_listen") && stderr.contains("admin_token_file"),
        "{stderr}"
    );
    // The node refuses to start with it too (no ready line, an error).
    let path = dir.path().join("exposed.toml");
    let status = Command::new(binary("waitroom-edge"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!status.status.success());
    assert!(String::from_utf8_lossy(&status.stderr).contains("admin_token_file"));

    let token = write_token(dir.path());
    let with_token = format!(
        "{}\n",
        exposed.replace(
            "workers = 1",
            &format!("workers = 1\nadmin_token_file = \"{}\"", token.display())
        )
    );
    let out = check(dir.path(), "with-token", &with_token);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A token file every user may read is refused by --check.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = check(dir.path(), "with-token", &with_token);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin.token"));
}

#[test]
fn check_refuses_a_state_dir_others_may_write() {
    let dir = TempDir::new("state-shm");
    let origin: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = check(dir.path(), "shm", &config(dir.path(), origin, ""));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--check accepted it: {stderr}");
    assert!(
        stderr.contains("node.state_dir") && stderr.contains(&state.display().to_string()),
        "{stderr}"
    );
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = check(dir.path(), "private", &config(dir.path(), origin, ""));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_planted_cookie_key_is_refused_at_start() {
    let dir = TempDir::new("planted-key");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let key = state.join("cookie.key");
    std::fs::write(&key, [0x41u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = dir.path().join("edge.toml");
    std::fs::write(&path, config(dir.path(), origin, "")).unwrap();
    let mut cmd = Command::new(binary("waitroom-edge"));
    cmd.arg("--config").arg(&path);
    let mut proc = Proc::spawn("edge", cmd, dir.path()).unwrap();
    assert!(
        proc.wait_line("waitroom-edge ready:", Duration::from_secs(10))
            .is_err(),
        "started with a key others can read"
    );
    let stderr = proc.stderr();
    assert!(
        stderr.contains(&key.display().to_string()) && stderr.contains("0644"),
        "{stderr}"
    );
}

#[test]
fn a_counters_file_truncated_under_a_running_node_does_not_stop_it() {
    let dir = TempDir::new("truncated");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let mut edge = Edge::start(dir.path(), "edge", &config(dir.path(), origin, "")).unwrap();
    let counters = dir.path().join("state").join("edge.counters");
    assert!(counters.exists(), "the counters default to the state dir");
    for _ in 0..3 {
        let (status, body) = get(&client(), &edge.url("/"));
        assert_eq!((status, body.contains(SITE)), (200, true), "{body}");
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&counters)
        .unwrap()
        .set_len(0)
        .unwrap();
    // Every visit after the truncation touches the unmapped pages: before the
    // guard, the first one killed the node with SIGBUS.
    for i in 0..5 {
        let (status, body) = get(&client(), &edge.url("/"));
        assert_eq!(
            (status, body.contains(SITE)),
            (200, true),
            "visit {i} after truncation: {body}\n{}",
            edge.proc.stderr()
        );
    }
    assert_eq!(get(&client(), &edge.admin_url("/status")).0, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !edge.proc.stderr().contains("truncated underneath") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        edge.proc.stderr().contains("truncated underneath"),
        "{}",
        edge.proc.stderr()
    );
    let status = edge.proc.terminate(Duration::from_secs(10)).expect("exits");
    assert!(status.success(), "{status:?}");
    // The next start sets the short file aside and starts a new one.
    let _edge = Edge::start(dir.path(), "edge-again", &config(dir.path(), origin, "")).unwrap();
    assert!(counters.with_extension("old").exists());
    assert!(std::fs::metadata(&counters).unwrap().len() > 4096);
}

#[test]
fn a_silent_admin_connection_is_closed_at_its_deadline() {
    use std::io::Read as _;
    let dir = TempDir::new("admin-deadline");
    let (_origin, origin) = start_origin(dir.path(), "origin").unwrap();
    let edge = Edge::start(dir.path(), "edge", &config(dir.path(), origin, "")).unwrap();
    let started = Instant::now();
    let mut silent = std::net::TcpStream::connect(edge.admin).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // Others are served meanwhile.
    assert_eq!(get(&client(), &edge.admin_url("/healthz")).0, 200);
    let mut buf = [0u8; 16];
    let n = silent.read(&mut buf).unwrap_or(0);
    let held = started.elapsed();
    assert_eq!(n, 0, "the node sent something to a silent client");
    // Held a while (not refused), then closed by CONNECTION_DEADLINE (10 s)
    // in waitroom-runtime's admin loop, not left open for ever.
    assert!(
        held >= Duration::from_secs(2) && held < Duration::from_secs(15),
        "closed after {held:?}"
    );
}
