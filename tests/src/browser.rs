//! A real headless Chromium, driven over the DevTools protocol.
//!
//! The browser keeps its own cookies and follows the page's own refreshes; the
//! test only reads what the page shows (`document.body.innerText`) and can take
//! a screenshot. Started with the flags this closed network needs (no
//! background networking, no QUIC, no component updates).
use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Value, json};
use tungstenite::{Message, WebSocket, stream::MaybeTlsStream};

use crate::procs::Proc;

/// Where Debian's chromium lives (installed by `cargo xtask setup`).
pub fn chromium_path() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// A running headless Chromium with one page, connected over DevTools.
#[derive(Debug)]
pub struct Browser {
    _proc: Proc,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Browser {
    /// Starts Chromium on `url` with a fresh profile in `dir`.
    pub fn open(dir: &Path, url: &str) -> Result<Self> {
        let chromium = chromium_path()
            .ok_or_else(|| anyhow!("chromium is not installed (run `cargo xtask setup`)"))?;
        let profile = dir.join("chromium-profile");
        std::fs::create_dir_all(&profile)?;
        let mut cmd = Command::new(chromium);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--window-size=1000,800",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url);
        let proc = Proc::spawn("chromium", cmd, dir)?;
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port: u16 = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let Some(Ok(port)) = text.lines().next().map(str::parse)
            {
                break port;
            }
            if Instant::now() > deadline {
                bail!(
                    "chromium did not open DevTools within 30 s; stderr:\n{}",
                    proc.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let ws_url = page_socket(port)?;
        let (socket, _) = tungstenite::connect(ws_url.as_str())
            .context("connecting to the page over DevTools")?;
        Ok(Self {
            _proc: proc,
            socket,
            next_id: 1,
        })
    }

    /// Sends one DevTools command and waits for its answer.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.socket.send(Message::text(
            json!({"id": id, "method": method, "params": params}).to_string(),
        ))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let msg = self.socket.read()?;
            let Message::Text(text) = msg else { continue };
            let v: Value = serde_json::from_str(text.as_str())?;
            if v["id"].as_u64() == Some(id) {
                if let Some(err) = v.get("error") {
                    bail!("{method}: {err}");
                }
                return Ok(v["result"].clone());
            }
        }
        bail!("{method}: no answer within 20 s")
    }

    /// Evaluates a JavaScript expression in the page and returns its value.
    pub fn eval(&mut self, expression: &str) -> Result<Value> {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        )?;
        Ok(r["result"]["value"].clone())
    }

    /// The text the page shows right now (empty while it loads).
    pub fn text(&mut self) -> String {
        self.eval("document.body ? document.body.innerText : ''")
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Polls the page text until `pred` holds, up to `limit`; returns the last text.
    pub fn wait_for_text(
        &mut self,
        limit: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            last = self.text();
            if pred(&last) {
                return Ok(last);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!("page never showed what was expected within {limit:?}; last text:\n{last}")
    }

    /// Saves a PNG screenshot of the page.
    pub fn screenshot(&mut self, path: &Path) -> Result<()> {
        use base64::Engine as _;
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}))?;
        let data = r["data"]
            .as_str()
            .ok_or_else(|| anyhow!("no screenshot data"))?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(data)?;
        std::fs::write(path, bytes)?;
        Ok(())
    }
}

/// The DevTools WebSocket URL of the first page target.
fn page_socket(port: u16) -> Result<String> {
    let agent = crate::edge::client();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(mut resp) = agent
            .get(&format!("http://127.0.0.1:{port}/json/list"))
            .call()
            && let Ok(text) = resp.body_mut().read_to_string()
            && let Ok(Value::Array(targets)) = serde_json::from_str::<Value>(&text)
            && let Some(url) = targets
                .iter()
                .find(|t| t["type"] == "page")
                .and_then(|t| t["webSocketDebuggerUrl"].as_str())
        {
            return Ok(url.to_owned());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("no page target on DevTools port {port}")
}
