//! `waitroom-aggregator ctl`: the control API from a terminal.
//!
//! A thin client: each command is one request to the admin listener's
//! `/api/` (see [`waitroom_runtime::control`]); the answer's JSON goes to
//! stdout, an error's to stderr with a non-zero exit. Where the API is and
//! which token to send come from the aggregator's config file
//! (`admin_listen`, `control_token_file`) unless `--url` and `--token-file`
//! say otherwise, so on the aggregator's machine
//! `waitroom-aggregator ctl set shop total_active_users=500` is enough.
//!
//! With several aggregators (`--url` once for each) a change is made on
//! every one, in order, only once they agree: the same version and the
//! same rooms. Each node takes its room settings from its home aggregator,
//! so aggregators that disagree would have nodes enforce different limits.
//! Each change carries the version it was checked at (`If-Match`), so a
//! change made elsewhere meanwhile stops it; one that stops part-way says
//! which aggregators have it.
use std::{io::Read as _, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::Value;

/// `ctl`'s options and command.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The admin listener, `http://host:port` (default: `admin_listen` of
    /// the config file); once per aggregator of a cluster of several.
    #[arg(long)]
    pub url: Vec<String>,
    /// The token file (default: `control_token_file` of the config file).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Which token of the file to send, by name (default: the first).
    #[arg(long = "as")]
    pub token_name: Option<String>,
    /// Refuse the change if the settings are no longer at this version (409).
    #[arg(long)]
    pub if_match: Option<u64>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// What to ask.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Every room's settings and the version in force.
    Rooms,
    /// One room's settings.
    Get { room: String },
    /// Change keys of a room: `KEY=VALUE` (VALUE is JSON when it reads as
    /// JSON, else a string: `total_active_users=500 queueing_method=random`;
    /// `KEY=null` puts a key back to its default).
    Set {
        room: String,
        #[arg(required = true)]
        changes: Vec<String>,
    },
    /// Apply a JSON merge patch to a room (`-` reads it from stdin).
    Patch { room: String, json: String },
    /// A room's scheduled events.
    Events { room: String },
    /// Add an event: a JSON object with a `name` (`-` reads stdin).
    AddEvent { room: String, json: String },
    /// Remove an event by name.
    DeleteEvent { room: String, name: String },
}

/// One request: method, path, body.
type Call = (&'static str, String, Option<Value>);

impl CtlCommand {
    fn call(&self) -> anyhow::Result<Call> {
        let room = |r: &str| format!("/api/rooms/{}", encode(r));
        Ok(match self {
            Self::Rooms => ("GET", "/api/rooms".into(), None),
            Self::Get { room: r } => ("GET", room(r), None),
            Self::Set { room: r, changes } => {
                let mut patch = serde_json::Map::new();
                for change in changes {
                    let Some((key, value)) = change.split_once('=') else {
                        bail!("{change:?}: write KEY=VALUE");
                    };
                    let value = serde_json::from_str(value)
                        .unwrap_or_else(|_| Value::String(value.to_owned()));
                    patch.insert(key.trim().to_owned(), value);
                }
                ("PATCH", room(r), Some(Value::Object(patch)))
            }
            Self::Patch { room: r, json } => ("PATCH", room(r), Some(read_json(json)?)),
            Self::Events { room: r } => ("GET", format!("{}/events", room(r)), None),
            Self::AddEvent { room: r, json } => (
                "POST",
                format!("{}/events", room(r)),
                Some(read_json(json)?),
            ),
            Self::DeleteEvent { room: r, name } => (
                "DELETE",
                format!("{}/events/{}", room(r), encode(name)),
                None,
            ),
        })
    }
}

/// Percent-encodes what may not stand in a path segment.
fn encode(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn read_json(text: &str) -> anyhow::Result<Value> {
    let text = if text == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        text.to_owned()
    };
    serde_json::from_str(&text).context("the JSON argument")
}

/// The token to send: the named one of the file, or its first.
fn token(path: &std::path::Path, name: Option<&str>) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        let (n, t) = match words[..] {
            [] => continue,
            [t] => ("admin", t),
            [n, t, ..] => (n, t),
        };
        if name.is_none_or(|want| want == n) {
            return Ok(t.to_owned());
        }
    }
    bail!(
        "{}: no token{}",
        path.display(),
        name.map(|n| format!(" named {n:?}")).unwrap_or_default()
    )
}

/// Runs `args` against the API; `config` fills in what the options leave
/// out. Returns the exit status and the answer's text.
pub fn run(
    args: &CtlArgs,
    config: Option<&crate::AggregatorConfig>,
) -> anyhow::Result<(bool, String)> {
    let urls: Vec<String> = match (&args.url[..], config.and_then(|c| c.admin_listen)) {
        ([], Some(addr)) => vec![format!("http://{addr}")],
        ([], None) => bail!("no --url, and the config file has no admin_listen"),
        (urls, _) => urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_owned())
            .collect(),
    };
    let token_file = args
        .token_file
        .clone()
        .or_else(|| config.and_then(|c| c.control.token_file.clone()))
        .context("no --token-file, and the config file has no control_token_file")?;
    let client = Client {
        token: token(&token_file, args.token_name.as_deref())?,
        agent: ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(15)))
            .http_status_as_error(false)
            .build()
            .into(),
    };
    let call = args.command.call()?;
    if let [url] = &urls[..] {
        return client.send(url, &call, args.if_match);
    }
    if args.if_match.is_some() {
        bail!(
            "--if-match names one aggregator's version; with several --url, ctl checks that they agree and sends each its own"
        );
    }
    if call.0 == "GET" {
        let mut all = serde_json::Map::new();
        let mut ok = true;
        for url in &urls {
            let (fine, text) = client.send(url, &call, None)?;
            ok &= fine;
            all.insert(url.clone(), answer_json(&text));
        }
        return Ok((ok, Value::Object(all).to_string()));
    }
    change_everywhere(&client, &urls, &call)
}

/// The token and the HTTP agent every request of a run shares.
struct Client {
    token: String,
    agent: ureq::Agent,
}

impl Client {
    /// One request to `url`: whether it succeeded, and the answer's text.
    fn send(
        &self,
        url: &str,
        (method, path, body): &Call,
        if_match: Option<u64>,
    ) -> anyhow::Result<(bool, String)> {
        let request = http::Request::builder()
            .method(*method)
            .uri(format!("{url}{path}"))
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json");
        let request = match if_match {
            Some(v) => request.header("if-match", format!("\"{v}\"")),
            None => request,
        };
        let mut response = match body {
            Some(body) => self.agent.run(request.body(body.to_string())?),
            None => self.agent.run(request.body(())?),
        }
        .with_context(|| format!("{method} {url}{path}"))?;
        let ok = response.status().is_success();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        Ok((ok, text))
    }
}

/// An answer's JSON, or its text as a JSON string when it is not JSON.
fn answer_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Makes the change `call` on every aggregator of `urls`, once all of them
/// hold the same version of the same rooms; stops at the first that refuses.
fn change_everywhere(
    client: &Client,
    urls: &[String],
    call: &Call,
) -> anyhow::Result<(bool, String)> {
    let rooms = ("GET", "/api/rooms".to_owned(), None);
    let mut seen: Vec<(u64, Value)> = Vec::with_capacity(urls.len());
    for url in urls {
        let (ok, text) = client.send(url, &rooms, None)?;
        let answer = answer_json(&text);
        let version = answer["version"].as_u64().filter(|_| ok);
        let Some(version) = version else {
            bail!(
                "{url}: could not read its rooms, so nothing was changed: {}",
                text.trim()
            );
        };
        seen.push((version, answer["rooms"].clone()));
    }
    let (first_version, first_rooms) = &seen[0];
    for (url, (version, rooms)) in urls.iter().zip(&seen).skip(1) {
        if version != first_version || rooms != first_rooms {
            let what = if version == first_version {
                "the same version number with other rooms".to_owned()
            } else {
                format!("version {version} against {first_version}")
            };
            bail!(
                "the aggregators disagree, so nothing was changed: {url} holds {what} at {}; \
                 compare `ctl --url {url} rooms` with `ctl --url {} rooms`, make them equal \
                 with a change on the one that is wrong, then try again",
                urls[0],
                urls[0]
            );
        }
    }
    let mut done = serde_json::Map::new();
    for (url, (version, _)) in urls.iter().zip(&seen) {
        let (ok, text) = client.send(url, call, Some(*version))?;
        if !ok {
            let changed: Vec<&String> = done.keys().collect();
            bail!(
                "{url} refused the change ({}); changed already: {}; not tried: {}",
                text.trim(),
                if changed.is_empty() {
                    "none".to_owned()
                } else {
                    format!("{changed:?}")
                },
                urls.iter()
                    .skip_while(|u| *u != url)
                    .skip(1)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        done.insert(url.clone(), answer_json(&text));
    }
    Ok((true, Value::Object(done).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_reads_values_as_json_or_strings() {
        let (method, path, body) = CtlCommand::Set {
            room: "shop 1".into(),
            changes: vec![
                "total_active_users=500".into(),
                "queueing_method=random".into(),
                "queue_all=true".into(),
                "session_duration=null".into(),
            ],
        }
        .call()
        .unwrap();
        assert_eq!((method, path.as_str()), ("PATCH", "/api/rooms/shop%201"));
        assert_eq!(
            body.unwrap(),
            serde_json::json!({"total_active_users": 500, "queueing_method": "random", "queue_all": true, "session_duration": null})
        );
        assert!(
            CtlCommand::Set {
                room: "shop".into(),
                changes: vec!["oops".into()]
            }
            .call()
            .is_err()
        );
    }
}
