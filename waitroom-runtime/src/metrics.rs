//! Prometheus exposition for both binaries, by `prometheus-client`.
//!
//! The request path keeps its relaxed atomics and fixed buckets and never
//! touches this module: a [`Collector`] registered once reads those atomics
//! when `/metrics` is scraped and writes each family with
//! [`Families`], so a scrape costs the admin listener, never a visitor.
//!
//! What the encoder guarantees and hand-written text did not: every family is
//! written once, its `# HELP` and `# TYPE` before its samples, label values
//! escaped (`"`, `\` and newlines in a room or node id), counters with their
//! `_total` suffix, and the `# EOF` the OpenMetrics format ends with (served
//! as `application/openmetrics-text`, which Prometheus asks for first).
//!
//! Conventions kept by the helpers here: a family without samples is left
//! out (no header without a sample), so "none yet" is an absent series and
//! never a `-1`; a counter is named with its `_total` at the call site so a
//! grep for the exposed name finds the code that writes it.
use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use http::StatusCode;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, exemplar::Exemplar, gauge::ConstGauge},
};
use waitroom_common::time::UnixMillis;

use crate::{admin::text, body::Body};

/// What an admin listener serves `/metrics` from (see [`registry`]).
pub use prometheus_client::registry::Registry;

/// The content type of [`encode`]'s text (OpenMetrics 1.0).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The labels of one sample: `(name, value)` pairs in the order written.
pub type Labels<'a, const N: usize> = [(&'static str, &'a str); N];

/// One histogram at scrape time: upper bounds (seconds, ascending, without
/// `+Inf`), the count in each bucket and above the last bound (not
/// cumulative: `counts.len() == bounds.len() + 1`), and the sum of the values.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum: f64,
}

/// A fixed-bucket latency histogram (seconds), lock-free.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in microseconds.
    bounds_us: &'static [u64],
    /// One count per bound plus the +Inf bucket.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

/// Bounds for request-path latencies: 1 µs to 10 s.
pub const LATENCY_BOUNDS_US: &[u64] = &[
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
    250_000, 500_000, 1_000_000, 2_500_000, 10_000_000,
];

impl Default for Histogram {
    /// With [`LATENCY_BOUNDS_US`].
    fn default() -> Self {
        Self::new(LATENCY_BOUNDS_US)
    }
}

impl Histogram {
    pub fn new(bounds_us: &'static [u64]) -> Self {
        Self {
            bounds_us,
            counts: (0..=bounds_us.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = self.bounds_us.partition_point(|&b| b < us);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    /// The counts now, for the exposition (buckets not cumulative).
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds_us.iter().map(|&us| us as f64 / 1e6).collect(),
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum: self.sum_ns.load(Relaxed) as f64 / 1e9,
        }
    }
}

impl HistogramSnapshot {
    fn encode(&self, mut metric: prometheus_client::encoding::MetricEncoder<'_>) -> fmt::Result {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.counts.iter().copied())
            .collect();
        metric.encode_histogram(
            self.sum,
            self.counts.iter().sum(),
            &buckets,
            None::<&HashMap<usize, Exemplar<Labels<'_, 0>, f64>>>,
        )
    }
}

/// Writes metric families into a scrape; see the module docs for the rules.
#[derive(Debug)]
pub struct Families<'a> {
    encoder: DescriptorEncoder<'a>,
}

impl Families<'_> {
    /// One unlabelled gauge.
    pub fn gauge(
        &mut self,
        name: &str,
        help: &str,
        value: impl EncodeGaugeValue + fmt::Debug,
    ) -> fmt::Result {
        let metric = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        ConstGauge::new(value).encode(metric)
    }

    /// One unlabelled counter; `name` ends in `_total`.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let metric = self.encoder.encode_descriptor(
            counter_family(name),
            help,
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(value).encode(metric)
    }

    /// A labelled gauge family; left out when `samples` is empty.
    pub fn gauges<L, V>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, V)>,
    ) -> fmt::Result
    where
        L: EncodeLabelSet,
        V: EncodeGaugeValue + fmt::Debug,
    {
        let mut samples = samples.into_iter().peekable();
        if samples.peek().is_none() {
            return Ok(());
        }
        let mut metric = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, value) in samples {
            ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A labelled counter family (`name` ends in `_total`); left out when
    /// `samples` is empty.
    pub fn counters<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, u64)>,
    ) -> fmt::Result {
        let mut samples = samples.into_iter().peekable();
        if samples.peek().is_none() {
            return Ok(());
        }
        let mut metric = self.encoder.encode_descriptor(
            counter_family(name),
            help,
            None,
            MetricType::Counter,
        )?;
        for (labels, value) in samples {
            ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A labelled histogram family (`name` ends in its unit); left out when
    /// `samples` is empty.
    pub fn histograms<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, HistogramSnapshot)>,
    ) -> fmt::Result {
        let mut samples = samples.into_iter().peekable();
        if samples.peek().is_none() {
            return Ok(());
        }
        let mut metric = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Histogram)?;
        for (labels, h) in samples {
            h.encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// One unlabelled histogram (`name` ends in its unit).
    pub fn histogram(&mut self, name: &str, help: &str, h: &HistogramSnapshot) -> fmt::Result {
        let metric = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Histogram)?;
        h.encode(metric)
    }
}

/// The family name of a counter: the encoder adds `_total` to each sample.
fn counter_family(name: &str) -> &str {
    debug_assert!(name.ends_with("_total"), "counter {name} without _total");
    name.strip_suffix("_total").unwrap_or(name)
}

/// A [`Collector`] made of a function that writes families at scrape time.
pub struct ScrapeFn<F>(pub F);

impl<F> fmt::Debug for ScrapeFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScrapeFn")
    }
}

impl<F> Collector for ScrapeFn<F>
where
    F: Fn(&mut Families<'_>) -> fmt::Result + Send + Sync + 'static,
{
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> fmt::Result {
        (self.0)(&mut Families { encoder })
    }
}

/// A registry of one collector, `scrape`: what an admin listener serves.
pub fn registry<F>(scrape: F) -> Arc<Registry>
where
    F: Fn(&mut Families<'_>) -> fmt::Result + Send + Sync + 'static,
{
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ScrapeFn(scrape)));
    Arc::new(registry)
}

/// The OpenMetrics text of `registry`.
#[must_use]
pub fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    if let Err(err) = prometheus_client::encoding::text::encode(&mut out, registry) {
        // Only a collector's own error gets here: writing to a String cannot fail.
        tracing::error!(%err, "metrics could not be encoded");
    }
    out
}

/// The `/metrics` response.
#[must_use]
pub fn response(registry: &Registry) -> http::Response<Body> {
    text(StatusCode::OK, CONTENT_TYPE, encode(registry))
}

/// `waitroom_build_info{version}`: 1, so a dashboard can show (and an alert
/// compare) which release each process runs.
pub fn build_info(f: &mut Families<'_>, version: &str) -> fmt::Result {
    f.gauges(
        "waitroom_build_info",
        "Always 1; the version label is the release this process runs.",
        [([("version", version)], 1i64)],
    )
}

/// What configuration reloads (SIGHUP) did, as Prometheus itself exports
/// it: whether the last one was applied, when the configuration in force
/// was loaded, and how many were applied or refused. Node and aggregator
/// write the same `waitroom_config_*` families.
#[derive(Debug)]
pub struct ReloadOutcomes {
    /// Whether the last reload was applied (true until one is refused).
    last_ok: AtomicBool,
    /// Clock milliseconds when the configuration in force was loaded.
    last_success_ms: AtomicU64,
    applied: AtomicU64,
    refused: AtomicU64,
}

impl ReloadOutcomes {
    /// The configuration loaded at start, at `now`.
    #[must_use]
    pub fn new(now: UnixMillis) -> Self {
        Self {
            last_ok: AtomicBool::new(true),
            last_success_ms: AtomicU64::new(now.0),
            applied: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Records one reload at `now`: applied or refused.
    pub fn record(&self, applied: bool, now: UnixMillis) {
        self.last_ok.store(applied, Relaxed);
        if applied {
            self.last_success_ms.store(now.0, Relaxed);
            self.applied.fetch_add(1, Relaxed);
        } else {
            self.refused.fetch_add(1, Relaxed);
        }
    }

    /// The `waitroom_config_*` families.
    pub fn encode(&self, f: &mut Families<'_>) -> fmt::Result {
        f.gauge(
            "waitroom_config_reload_success",
            "1 if the last configuration reload was applied (or none was tried), 0 if it was refused.",
            i64::from(self.last_ok.load(Relaxed)),
        )?;
        f.gauge(
            "waitroom_config_last_reload_success_timestamp_seconds",
            "When the configuration in force was loaded (start or last applied reload).",
            self.last_success_ms.load(Relaxed) as f64 / 1e3,
        )?;
        f.counters(
            "waitroom_config_reloads_total",
            "Reloads (SIGHUP) by result: applied, or refused (the old configuration stays in force).",
            [
                ([("result", "applied")], self.applied.load(Relaxed)),
                ([("result", "refused")], self.refused.load(Relaxed)),
            ],
        )
    }
}

/// The help text of the wait-estimate gauges (node and aggregator).
pub const WAIT_ESTIMATE_HELP: &str = "The wait a visitor arriving now is told (the median for a random queue): the engine's estimate the queue page and the dashboard show; absent while unknown (no admit rate yet, or queue_all).";

/// The help text of a room's settings-version gauge (node and aggregator).
pub const SETTINGS_VERSION_HELP: &str = "Version of the room settings in force: the aggregator's current version (it increases with every change through the control API or the config file); on a node, the version it last applied from the aggregator, or its own control API's version without an aggregator; 0 on a node that runs its file's settings and has been pushed none. A node whose value is below the aggregator's is behind.";

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(f: impl Fn(&mut Families<'_>) -> fmt::Result + Send + Sync + 'static) -> String {
        encode(&registry(f))
    }

    #[test]
    fn an_unlabelled_histogram_has_its_buckets_count_and_sum() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(3));
        h.observe(Duration::from_millis(30));
        let text = scrape(move |f| f.histogram("merge_seconds", "A histogram.", &h.snapshot()));
        assert!(text.contains("merge_seconds_count 2\n"), "{text}");
        assert!(
            text.contains("merge_seconds_bucket{le=\"0.000005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("merge_seconds_bucket{le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("merge_seconds_sum 0.030003\n"), "{text}");
    }

    #[test]
    fn families_are_whole_escaped_and_end_with_eof() {
        let text = scrape(|f| {
            f.gauge("g_seconds", "A gauge.", 1.5)?;
            f.counter("c_total", "A counter.", 3)?;
            f.gauges(
                "room_gauge",
                "Per room.",
                [
                    ([("room", "a\"b\\c\nd")], 1u64),
                    ([("room", "plain")], 2u64),
                ],
            )?;
            f.counters(
                "empty_total",
                "Never written.",
                Vec::<(Labels<'_, 1>, u64)>::new(),
            )?;
            build_info(f, "1.2.3")
        });
        assert_eq!(
            text,
            "# HELP g_seconds A gauge.\n# TYPE g_seconds gauge\ng_seconds 1.5\n\
             # HELP c A counter.\n# TYPE c counter\nc_total 3\n\
             # HELP room_gauge Per room.\n# TYPE room_gauge gauge\n\
             room_gauge{room=\"a\\\"b\\\\c\\nd\"} 1\nroom_gauge{room=\"plain\"} 2\n\
             # HELP waitroom_build_info Always 1; the version label is the release this process runs.\n\
             # TYPE waitroom_build_info gauge\nwaitroom_build_info{version=\"1.2.3\"} 1\n\
             # EOF\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_inf() {
        let text = scrape(|f| {
            f.histograms(
                "h_seconds",
                "A histogram.",
                [(
                    [("room", "r")],
                    HistogramSnapshot {
                        bounds: vec![0.001, 0.01],
                        counts: vec![1, 2, 3],
                        sum: 4.5,
                    },
                )],
            )
        });
        for line in [
            "# TYPE h_seconds histogram",
            "h_seconds_sum{room=\"r\"} 4.5",
            "h_seconds_count{room=\"r\"} 6",
            "h_seconds_bucket{le=\"0.001\",room=\"r\"} 1",
            "h_seconds_bucket{le=\"0.01\",room=\"r\"} 3",
            "h_seconds_bucket{le=\"+Inf\",room=\"r\"} 6",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn reload_outcomes_keep_the_last_success() {
        let r = Arc::new(ReloadOutcomes::new(UnixMillis(1_000)));
        r.record(true, UnixMillis(5_000));
        r.record(false, UnixMillis(9_000));
        let text = scrape({
            let r = Arc::clone(&r);
            move |f| r.encode(f)
        });
        for line in [
            "waitroom_config_reload_success 0",
            "waitroom_config_last_reload_success_timestamp_seconds 5.0",
            "waitroom_config_reloads_total{result=\"applied\"} 1",
            "waitroom_config_reloads_total{result=\"refused\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
