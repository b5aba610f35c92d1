//! The privileged fixture the XDP node tests share: a network namespace with
//! a veth pair the test made, a demo origin, an admin token file and the
//! config of a node that attaches its XDP program to the host end of the pair
//! and listens on the host address. Visitors connect from inside the
//! namespace, so every packet crosses the program.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, SocketAddrV4, TcpStream},
    os::unix::fs::PermissionsExt as _,
    process::Command,
    time::Duration,
};

use anyhow::Result;

use crate::{
    netns::NetNs,
    procs::{Proc, TempDir, free_port, start_origin},
};

/// Everything an XDP node test starts its node with.
#[derive(Debug)]
pub struct XdpNodeFixture {
    /// Fields drop in this order: the origin stops, its files go, then the
    /// namespace's own Drop removes the pair (also when a test fails).
    pub origin: Proc,
    pub dir: TempDir,
    pub ns: NetNs,
    /// The node's visitor address: the host end of the pair.
    pub listen: SocketAddr,
    pub port: u16,
    /// The admin bearer token, also written to the node's token file.
    pub token: &'static str,
    /// The node's config (`workers` as asked).
    pub config: String,
}

impl XdpNodeFixture {
    /// A namespace, an origin and the config of node `tag` with `workers`.
    pub fn new(tag: &str, workers: usize, token: &'static str) -> Result<Self> {
        let ns = NetNs::new()?;
        let dir = TempDir::new(tag);
        let (origin, origin_addr) = start_origin(dir.path(), "origin")?;
        let port = free_port()?;
        let listen = SocketAddr::V4(SocketAddrV4::new(ns.host_addr(), port));
        let token_file = dir.path().join("admin.token");
        std::fs::write(&token_file, token)?;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600))?;
        let config = format!(
            r#"[node]
id = "{tag}"
listen = "{listen}"
admin_listen = "127.0.0.1:0"
workers = {workers}
counters_path = "{counters}"
admin_token_file = "{token_file}"

[xdp]
interface = "{interface}"
ports = [{port}]

[[rooms]]
id = "shop"
origin = "{origin_addr}"
total_active_users = 100
new_users_per_minute = 100
"#,
            counters = dir.path().join("counters.shm").display(),
            token_file = token_file.display(),
            interface = ns.host_if(),
        );
        Ok(Self {
            origin,
            dir,
            ns,
            listen,
            port,
            token,
            config,
        })
    }

    /// One HTTP request over a fresh connection from inside the namespace.
    pub fn visit_from_inside(&self) -> std::io::Result<String> {
        let to = self.listen;
        self.ns.run_inside(|| {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"GET / HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        })?
    }

    /// `ip -d link show dev IF` of the host end: names the XDP program while
    /// one is attached.
    #[must_use]
    pub fn link(&self) -> String {
        Command::new("ip")
            .args(["-d", "link", "show", "dev", self.ns.host_if()])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default()
    }
}
