//! The demo's visitors: a small, bounded traffic generator.
//!
//! Visitors arrive a few per second, keep their cookies, obey the queue page's
//! `Refresh` header, browse a few pages once admitted and then leave. The demo
//! prints what is happening as it goes, so a newcomer sees the waiting room work
//! (and can open the URL in a browser to join the queue themselves).
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// One simulated visitor.
struct Visitor {
    agent: ureq::Agent,
    /// Which node this visitor talks to (their colo's).
    node: usize,
    next_at: Instant,
    arrived: Instant,
    admitted_at: Option<Instant>,
    pages_left: u32,
}

/// Counts printed by the demo.
#[derive(Debug, Default)]
struct Tally {
    arrived: u64,
    admitted: u64,
    queued_pages: u64,
    left: u64,
    errors: u64,
    waits_secs: Vec<u64>,
}

/// Drives visitors against `nodes` (base URLs) until `stop` or `limit`.
pub fn run(nodes: &[String], admins: &[String], stop: &Arc<AtomicBool>, limit: Option<Duration>) {
    const MAX_VISITORS: usize = 400;
    let started = Instant::now();
    let mut visitors: Vec<Visitor> = Vec::new();
    let mut tally = Tally::default();
    let mut next_arrival = started;
    let mut next_report = started + Duration::from_secs(5);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    while !stop.load(Ordering::SeqCst) && limit.is_none_or(|l| started.elapsed() < l) {
        let now = Instant::now();
        // Arrivals: a launch-day rush for the first 30 s, then a steady trickle.
        if now >= next_arrival && tally.arrived < MAX_VISITORS as u64 {
            let gap_ms = if started.elapsed() < Duration::from_secs(30) {
                500
            } else {
                8_000
            };
            next_arrival = now + Duration::from_millis(gap_ms / 2 + rand() % gap_ms);
            visitors.push(Visitor {
                agent: ureq::Agent::config_builder()
                    .timeout_global(Some(Duration::from_secs(5)))
                    .http_status_as_error(false)
                    .build()
                    .into(),
                node: (rand() % nodes.len() as u64) as usize,
                next_at: now,
                arrived: now,
                admitted_at: None,
                pages_left: 2 + (rand() % 4) as u32,
            });
            tally.arrived += 1;
        }
        // Each visitor whose time has come makes one request.
        for v in visitors.iter_mut().filter(|v| v.next_at <= now) {
            let url = format!("{}/product/{}", nodes[v.node], 1 + rand() % 3);
            match v.agent.get(&url).call() {
                Ok(mut resp) => {
                    let refresh = resp
                        .headers()
                        .get("refresh")
                        .and_then(|h| h.to_str().ok())
                        .and_then(|s| s.parse::<u64>().ok());
                    let _ = resp.body_mut().read_to_vec();
                    match refresh {
                        Some(secs) => {
                            tally.queued_pages += 1;
                            v.next_at = now + Duration::from_secs(secs);
                        }
                        None => {
                            if v.admitted_at.is_none() {
                                v.admitted_at = Some(now);
                                tally.admitted += 1;
                                tally
                                    .waits_secs
                                    .push(now.duration_since(v.arrived).as_secs());
                            }
                            v.pages_left = v.pages_left.saturating_sub(1);
                            v.next_at = now + Duration::from_secs(5 + rand() % 10);
                        }
                    }
                }
                Err(_) => {
                    tally.errors += 1;
                    v.next_at = now + Duration::from_secs(5);
                }
            }
        }
        let before = visitors.len();
        // Visitors who finished browsing leave (their sessions then expire).
        visitors.retain(|v| v.pages_left > 0);
        tally.left += (before - visitors.len()) as u64;
        if now >= next_report {
            next_report = now + Duration::from_secs(5);
            report(started, &tally, &visitors, admins);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn report(started: Instant, tally: &Tally, visitors: &[Visitor], admins: &[String]) {
    let waiting = visitors.iter().filter(|v| v.admitted_at.is_none()).count();
    let on_site = visitors.len() - waiting;
    let mean_wait = if tally.waits_secs.is_empty() {
        0
    } else {
        tally.waits_secs.iter().sum::<u64>() / tally.waits_secs.len() as u64
    };
    println!(
        "[{:>4}s] visitors: {} arrived, {} admitted (mean wait {mean_wait}s), {} waiting, {} browsing, {} left{}",
        started.elapsed().as_secs(),
        tally.arrived,
        tally.admitted,
        waiting,
        on_site,
        tally.left,
        if tally.errors > 0 {
            format!(", {} errors", tally.errors)
        } else {
            String::new()
        }
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    for admin in admins {
        let Ok(mut resp) = agent.get(&format!("{admin}/status")).call() else {
            continue;
        };
        let Ok(v) = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()))
        else {
            continue;
        };
        for room in v["rooms"].as_array().into_iter().flatten() {
            println!(
                "        node {} ({}) room {}: active {}/{} (global {}), admitted this minute {}/{}, waiting {} (global {})",
                v["node"].as_str().unwrap_or("?"),
                v["colo"].as_str().unwrap_or("?"),
                room["id"].as_str().unwrap_or("?"),
                room["node_active_users"],
                room["total_active_users"],
                room["global_active_users"],
                room["node_admitted_this_minute"],
                room["new_users_per_minute"],
                room["node_waiting"],
                room["global_waiting"],
            );
        }
    }
}
