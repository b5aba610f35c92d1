//! The node drops its capabilities once XDP is attached (privileged): the real
//! `waitroom-edge` binary, started as root with every capability, attaches to
//! the host end of a veth pair the test made; once it says it is ready, every
//! one of its threads holds at most what the node decided to keep (`CAP_BPF`
//! only on kernels before 6.5 that need it for map access, `CAP_NET_ADMIN`
//! only for a netlink attachment), and still the deny-list admin API changes
//! what the kernel drops, the telemetry reads the kernel's counters, and
//! SIGTERM detaches the program.
//!
//! Skips, saying why, when not run as root.
use std::time::{Duration, Instant};

use waitroom_tests::{
    edge::{Edge, client, get_text, metric},
    require_root,
    xdp_node::XdpNodeFixture,
};

const TOKEN: &str = "0b1c2d3e4f5a69788796a5b4c3d2e1f0";
/// Capability numbers (`linux/capability.h`).
const CAP_NET_ADMIN: u32 = 12;
const CAP_BPF: u32 = 39;

/// `(tid, CapEff, CapPrm, CapBnd, CapInh, CapAmb)` of every thread of `pid`.
fn thread_caps(pid: u32) -> Vec<(String, [u64; 5])> {
    let field = |status: &str, name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no {name} in {status}"))
    };
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|task| {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            Some((
                task.file_name().to_string_lossy().into_owned(),
                ["CapEff:", "CapPrm:", "CapBnd:", "CapInh:", "CapAmb:"].map(|f| field(&status, f)),
            ))
        })
        .collect()
}

/// `text` without ANSI colour sequences (the log colours field names).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // `ESC [ ... m`
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The running kernel's `(major, minor)`.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[test]
fn the_node_keeps_only_what_the_deny_list_telemetry_and_detach_need() {
    if !require_root() {
        return;
    }
    let fixture =
        XdpNodeFixture::new("xdp-caps", 2, TOKEN).expect("namespace, veth pair and origin");
    let XdpNodeFixture {
        ns,
        dir,
        port,
        config,
        ..
    } = &fixture;
    let port = *port;
    let mut edge = Edge::start(dir.path(), "edge", config).unwrap();
    let pid = edge.proc.pid().unwrap();
    let log = plain(&edge.proc.stderr());
    assert!(fixture.link().contains("xdp"), "{log}");

    // What the node kept is what every thread's permitted set holds now.
    let threads = thread_caps(pid);
    assert!(
        threads.len() >= 4,
        "main, control and two workers: {threads:?}"
    );
    let kept = threads[0].1[1];
    let allowed = (1u64 << CAP_BPF) | (1 << CAP_NET_ADMIN);
    assert_eq!(kept & !allowed, 0, "kept more than BPF/NET_ADMIN: {kept:x}");
    if kernel_version() >= (6, 5) {
        assert_eq!(
            kept & (1 << CAP_BPF),
            0,
            "kernels from 6.5 need no CAP_BPF for maps through an open descriptor"
        );
    }
    for (tid, [eff, prm, bnd, inh, amb]) in &threads {
        assert_eq!(*prm, kept, "task {tid}: CapPrm {prm:x}, kept {kept:x}");
        assert_eq!(eff & !kept, 0, "task {tid}: CapEff {eff:x}");
        assert_eq!(bnd & !kept, 0, "task {tid}: CapBnd {bnd:x}");
        assert_eq!((*inh, *amb), (0, 0), "task {tid}: CapInh/CapAmb");
    }
    // Dropped while the starting thread was the only one, and said so.
    let line = log
        .lines()
        .find(|l| l.contains("capabilities dropped after start"))
        .unwrap_or_else(|| panic!("no capabilities line: {log}"));
    assert!(
        line.contains("threads=1") && line.contains("CAP_SYS_ADMIN"),
        "{line}"
    );
    assert!(!log.contains("still hold capabilities"), "{log}");

    // Telemetry: the kernel's SYN counter, read from the maps after the drop.
    let metrics = || get_text(&edge.admin_url("/metrics"));
    for _ in 0..3 {
        let answer = fixture
            .visit_from_inside()
            .expect("a visit through the veth");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let series = format!("waitroom_xdp_port_syns_total{{port=\"{port}\"}}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut syns = 0.0;
    while syns < 3.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        syns = metric(&metrics(), &series).unwrap_or(0.0);
    }
    assert!(
        syns >= 3.0,
        "SYNs read from the kernel after the drop: {syns}"
    );

    // The deny list: added through the admin API, the kernel drops the
    // source; removed, it passes again.
    let admin = client();
    let prefix = format!("{}/32", ns.peer_addr());
    let status = admin
        .post(&edge.admin_url(&format!("/deny?prefix={prefix}")))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .send_empty()
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 200, "{}", edge.proc.stderr());
    assert!(fixture.visit_from_inside().is_err(), "denied, got through");
    let list = get_text(&edge.admin_url("/deny"));
    assert!(list.contains(&prefix), "{list}");
    let status = admin
        .delete(&edge.admin_url(&format!("/deny?prefix={prefix}")))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .call()
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 200, "{}", edge.proc.stderr());
    assert!(
        fixture
            .visit_from_inside()
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );

    // SIGTERM: a clean exit, and the interface has no program left.
    let status = edge.proc.terminate(Duration::from_secs(10)).expect("exit");
    assert!(status.success(), "{status:?}: {}", edge.proc.stderr());
    let link = fixture.link();
    assert!(
        !link.contains("xdp"),
        "the program outlived the node: {link}"
    );
    let log = plain(&edge.proc.stderr());
    assert!(
        log.contains("XDP program detached") && !log.contains("detaching the XDP program"),
        "detached without a warning: {log}"
    );
}
