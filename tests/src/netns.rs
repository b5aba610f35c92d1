//! A network namespace joined to the root namespace by a veth pair, made for
//! one test and removed when the guard drops (also when the test panics).
//!
//! ```text
//!  root namespace                      namespace `wr-<pid>-<n>`
//!  host_if 198.18.a.b+1/30  <──veth──>  peer_if 198.18.a.b+2/30
//!  route <spoof prefix> via peer        (forwarding off: replies die here)
//! ```
//!
//! Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for
//! benchmarking, so they cannot be anyone's real network: the pair uses a /30
//! of 198.18.0.0/16 and each guard owns a /20 of 198.19.0.0/16 as source
//! addresses a test may forge. The route for that /20 points into the
//! namespace, so whatever the root namespace answers to a forged source
//! (RSTs, ICMP errors) goes back across the pair and is dropped there instead
//! of leaving through the default route. Link and route vanish with the link.

use std::{
    fs::File,
    io,
    net::Ipv4Addr,
    os::fd::AsRawFd,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
    thread,
};

/// Guards handed out by this process so far; part of every name and address.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A namespace, a veth pair into it, addresses and a route; removed on drop.
#[derive(Debug)]
pub struct NetNs {
    /// Namespace name (`ip netns`).
    name: String,
    /// veth end in the root namespace (where XDP is attached).
    host_if: String,
    /// veth end inside the namespace.
    peer_if: String,
    /// Address of `host_if`.
    host_addr: Ipv4Addr,
    /// Address of `peer_if`.
    peer_addr: Ipv4Addr,
    /// First address of the /20 this guard may forge sources from.
    spoof_base: Ipv4Addr,
}

impl NetNs {
    /// Creates the namespace, the pair, the addresses and the return route.
    /// On failure whatever was already made is removed again.
    pub fn new() -> io::Result<Self> {
        // Another process's guard (a second test run beside this one) may
        // hold the names or the /20 this one would take: then the next.
        let mut tries = 0;
        loop {
            match Self::try_new() {
                Err(e) if tries < 16 && e.to_string().contains("File exists") => tries += 1,
                other => return other,
            }
        }
    }

    fn try_new() -> io::Result<Self> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // 14 bits of uniqueness: the /30 index within 198.18.0.0/16.
        let slot = (pid.wrapping_mul(64).wrapping_add(n)) % (1 << 14);
        let tag = format!("{:x}", (pid % 0x10000) * 0x100 + (n % 0x100));
        let pair = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + slot * 4;
        let ns = Self {
            name: format!("wr-{pid}-{n}"),
            host_if: format!("wrh{tag}"),
            peer_if: format!("wrp{tag}"),
            host_addr: Ipv4Addr::from(pair + 1),
            peer_addr: Ipv4Addr::from(pair + 2),
            spoof_base: Ipv4Addr::from(
                u32::from(Ipv4Addr::new(198, 19, 0, 0)) + (slot % 16) * 4096,
            ),
        };
        // From here on `Drop` cleans up, whatever step fails.
        ns.setup()?;
        Ok(ns)
    }

    fn setup(&self) -> io::Result<()> {
        let (ns, host, peer) = (&self.name, &self.host_if, &self.peer_if);
        ip(&["netns", "add", ns])?;
        ip(&["link", "add", host, "type", "veth", "peer", "name", peer])?;
        ip(&["link", "set", peer, "netns", ns])?;
        // No IPv6 on the pair: router solicitations and MLD reports would be
        // noise in the counters the tests read.
        disable_ipv6(host)?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", self.host_addr),
            "dev",
            host,
        ])?;
        ip(&["link", "set", host, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        self.run_inside(|| disable_ipv6(peer))??;
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/30", self.peer_addr),
            "dev",
            peer,
        ])?;
        ip(&["-n", ns, "link", "set", peer, "up"])?;
        let spoof = format!("{}/20", self.spoof_base);
        ip(&[
            "route",
            "add",
            &spoof,
            "via",
            &self.peer_addr.to_string(),
            "dev",
            host,
        ])?;
        Ok(())
    }

    /// The namespace's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The veth end in the root namespace: attach XDP here.
    #[must_use]
    pub fn host_if(&self) -> &str {
        &self.host_if
    }

    /// The veth end inside the namespace.
    #[must_use]
    pub fn peer_if(&self) -> &str {
        &self.peer_if
    }

    /// Address of the root-namespace end: the destination of test traffic.
    #[must_use]
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// Address of the namespace end.
    #[must_use]
    pub fn peer_addr(&self) -> Ipv4Addr {
        self.peer_addr
    }

    /// The `i`-th of the 4096 source addresses this guard may forge
    /// (wraps around).
    #[must_use]
    pub fn spoofed_source(&self, i: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.spoof_base) + (i % 4096))
    }

    /// Runs `f` on a thread that has entered the namespace and returns its
    /// result. Sockets `f` creates stay in the namespace wherever they are
    /// used afterwards.
    pub fn run_inside<T, F>(&self, f: F) -> io::Result<T>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let path = format!("/run/netns/{}", self.name);
        let ns_file = File::open(&path)?;
        thread::scope(|scope| {
            scope
                .spawn(move || {
                    // SAFETY: `ns_file` is an open namespace file; `setns`
                    // only changes this (short-lived) thread's network
                    // namespace, which no other thread relies on.
                    if unsafe { libc::setns(ns_file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Runs a command inside the namespace (`ip netns exec`).
    pub fn exec(&self, program: &str, args: &[&str]) -> io::Result<Output> {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        Command::new("ip").args(full).output()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting one end deletes the pair (and the route through it);
        // deleting the namespace would too, but be explicit for the case where
        // the peer never made it into the namespace. Errors are expected for
        // the parts a failed `setup` never created.
        let _ = quiet(&["link", "del", &self.host_if]);
        let _ = quiet(&["netns", "del", &self.name]);
    }
}

/// Runs `ip ARGS`, turning a non-zero exit into an error that carries stderr.
fn ip(args: &[&str]) -> io::Result<()> {
    let output = Command::new("ip").args(args).output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Turns IPv6 off on `interface` of the calling thread's namespace (the
/// `/proc/sys/net` a thread sees follows its namespace).
fn disable_ipv6(interface: &str) -> io::Result<()> {
    let path = format!("/proc/sys/net/ipv6/conf/{interface}/disable_ipv6");
    std::fs::write(&path, "1").map_err(|e| io::Error::new(e.kind(), format!("writing {path}: {e}")))
}

fn quiet(args: &[&str]) -> io::Result<Output> {
    Command::new("ip").args(args).output()
}
