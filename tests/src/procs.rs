//! Starting the real binaries for a test, and stopping them in `Drop`.
//!
//! Binaries come from the workspace's target directory (`cargo xtask test` builds
//! them first; when one is missing it is built here once). Every process gets
//! SIGTERM then SIGKILL when its guard drops, also when the test panics.
use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, mpsc},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

/// The directory holding the workspace's debug binaries (next to this test's own).
/// Where the workspace's binaries are looked for, in order.
///
/// `WAITROOM_BIN_DIR` (a `:`-separated list, searched in order) is for
/// measurements against optimized binaries with debug-built tests, e.g.
/// `target/release:target/debug` after `cargo build --release -p
/// waitroom-edge`: the node comes from the first directory, the test
/// helpers only built in debug (the demo origin) from the second.
/// Otherwise the directory of the running test's own profile.
pub fn bin_dirs() -> Vec<PathBuf> {
    if let Some(dirs) = std::env::var_os("WAITROOM_BIN_DIR") {
        return std::env::split_paths(&dirs).collect();
    }
    // target/debug/deps/<test> → target/debug
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a directory");
    vec![deps.parent().unwrap_or(deps).to_path_buf()]
}

static BUILD: Mutex<bool> = Mutex::new(false);

/// Path of a workspace binary, building the workspace's binaries once if it
/// is missing from every directory of [`bin_dirs`].
pub fn binary(name: &str) -> PathBuf {
    let dirs = bin_dirs();
    let find = || dirs.iter().map(|d| d.join(name)).find(|p| p.exists());
    let mut built = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if find().is_none() && !*built {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--workspace", "--bins"])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap())
            .status()
            .expect("running cargo build");
        assert!(status.success(), "cargo build of the binaries failed");
        *built = true;
    }
    find().unwrap_or_else(|| {
        panic!("{name} missing from {dirs:?} (run `cargo build --workspace --bins`)")
    })
}

/// A scratch directory removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let unique = format!("waitroom-test-{tag}-{}-{}", std::process::id(), rand_u64());
        let dir = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&dir).expect("creating a temp dir");
        Self(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

/// A running process; stopped on drop. Its stderr is kept for failure messages.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    /// Lines the process printed on stdout, as they arrive.
    stdout: mpsc::Receiver<String>,
    stderr_log: PathBuf,
    /// Stopped by `SIGSTOP` (see [`Proc::freeze`]).
    frozen: bool,
}

impl Proc {
    /// Starts `cmd` with stdout piped (read line by line) and stderr in a file.
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> Result<Self> {
        let stderr_log = log_dir.join(format!("{name}.stderr"));
        let stderr = std::fs::File::create(&stderr_log)?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("spawning {name}: {cmd:?}"))?;
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            stdout: rx,
            stderr_log,
            frozen: false,
        })
    }

    /// Waits for a stdout line starting with `prefix` and returns it.
    pub fn wait_line(&mut self, prefix: &str, limit: Duration) -> Result<String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "{}: no line starting {prefix:?} within {limit:?}; stderr:\n{}",
                    self.name,
                    self.stderr()
                );
            }
            match self
                .stdout
                .recv_timeout(left.min(Duration::from_millis(200)))
            {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(status) = self
                        .child
                        .as_mut()
                        .and_then(|c| c.try_wait().ok().flatten())
                    {
                        bail!(
                            "{} exited ({status}) before printing {prefix:?}; stderr:\n{}",
                            self.name,
                            self.stderr()
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!(
                        "{} closed stdout before printing {prefix:?}; stderr:\n{}",
                        self.name,
                        self.stderr()
                    )
                }
            }
        }
    }

    /// What the process wrote on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `SIGSTOP` (`true`: the process stops where it is, as a long GC pause
    /// or a stalled VM would) or `SIGCONT` (`false`).
    pub fn freeze(&mut self, frozen: bool) {
        if let Some(pid) = self.pid() {
            let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: kill(2) on our own child, which we have not reaped.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
            self.frozen = frozen;
        }
    }

    /// Sends SIGTERM (after SIGCONT to a frozen process, which would not
    /// see it) and waits up to `limit` for the exit status.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        if self.frozen {
            self.freeze(false);
        }
        let child = self.child.as_mut()?;
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let status = child.wait().ok();
        self.child = None;
        status
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.terminate(Duration::from_secs(3));
        }
    }
}

/// Parses `key=value` words of a ready line.
pub fn ready_field(line: &str, key: &str) -> Result<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')))
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("no {key}= in {line:?}"))
}

/// The demo origin on a free loopback port.
pub fn start_origin(dir: &Path, name: &str) -> Result<(Proc, SocketAddr)> {
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut cmd = Command::new(binary("waitroom-demo-origin"));
    cmd.args(["--listen", &addr.to_string()]);
    let proc = Proc::spawn(name, cmd, dir)?;
    wait_connectable(addr, Duration::from_secs(10))?;
    Ok((proc, addr))
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    // The tests of one binary run at once, and a port is only free until
    // its process binds it: never hand the same one out twice in this
    // process, or two tests' servers meet (an etcd test once talked to the
    // other test's cluster and got a quorum it should not have had).
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..64 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    bail!("no port not handed out before in 64 tries")
}

/// Waits until `addr` accepts TCP connections.
pub fn wait_connectable(addr: SocketAddr, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{addr} did not accept connections within {limit:?}")
}
