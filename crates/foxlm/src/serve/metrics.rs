//! `GET /metrics`: the server's counters in Prometheus' text exposition format (version 0.0.4):
//! requests, tokens, the queue, batch occupancy, time to first token and inter-token latency
//! histograms (measured where the HTTP layer receives the scheduler's events), and on a GPU its
//! memory.

use super::scheduler::SchedulerStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Bucket upper bounds in seconds (the last bucket, +Inf, is implied).
const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A latency histogram: per-bucket counts (not cumulative; summed when written), the sum in
/// microseconds and the count.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS.iter().position(|&b| s <= b).unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(d.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (i, c) in self.counts.iter().enumerate() {
            acc += c.load(Ordering::Relaxed);
            let le = BUCKETS.get(i).map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", self.count.load(Ordering::Relaxed));
    }
}

/// What the HTTP layer counts (the scheduler counts the rest in [`SchedulerStats`]).
#[derive(Default)]
pub struct Metrics {
    /// Completion requests accepted by the scheduler, and those refused because the queue was full.
    pub requests: AtomicUsize,
    pub rejected: AtomicUsize,
    pub prompt_tokens: AtomicUsize,
    pub generation_tokens: AtomicUsize,
    pub ttft: Histogram,
    pub itl: Histogram,
}

fn counter(out: &mut String, name: &str, help: &str, v: usize) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// The text of `GET /metrics`.
pub fn render(m: &Metrics, s: &SchedulerStats, max_batch: usize) -> String {
    let g = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    let mut out = String::new();
    counter(&mut out, "foxlm_requests_total", "Completion requests accepted.", g(&m.requests));
    counter(
        &mut out,
        "foxlm_requests_rejected_total",
        "Completion requests answered 503: the queue was full.",
        g(&m.rejected),
    );
    counter(&mut out, "foxlm_prompt_tokens_total", "Prompt tokens of accepted requests.", g(&m.prompt_tokens));
    counter(&mut out, "foxlm_generation_tokens_total", "Tokens generated and sent.", g(&m.generation_tokens));
    gauge(&mut out, "foxlm_queue_length", "Requests waiting in the queue.", g(&s.queued) as f64);
    gauge(
        &mut out,
        "foxlm_waiting_sequences",
        "Sequences taken from the queue, waiting for a place in the batch.",
        g(&s.waiting) as f64,
    );
    gauge(&mut out, "foxlm_running_sequences", "Sequences in the running batch.", g(&s.running) as f64);
    gauge(&mut out, "foxlm_max_batch", "Most sequences in the batch (--max-batch).", max_batch as f64);
    gauge(
        &mut out,
        "foxlm_batch_occupancy",
        "Running sequences over --max-batch.",
        g(&s.running) as f64 / max_batch.max(1) as f64,
    );
    counter(&mut out, "foxlm_decode_steps_total", "Decode steps (forward passes over the running batch).", g(&s.steps));
    counter(&mut out, "foxlm_decoded_rows_total", "Rows decoded over all steps.", g(&s.rows_decoded));
    counter(&mut out, "foxlm_prefills_total", "Prefill passes.", g(&s.prefills));
    counter(&mut out, "foxlm_sequences_finished_total", "Sequences that ended (length, end of text).", g(&s.finished));
    counter(
        &mut out,
        "foxlm_sequences_cancelled_total",
        "Sequences cut short (client gone, stop string).",
        g(&s.cancelled),
    );
    m.ttft.write(
        &mut out,
        "foxlm_time_to_first_token_seconds",
        "From a request's arrival to its choice's first token.",
    );
    m.itl.write(&mut out, "foxlm_inter_token_latency_seconds", "Between a choice's consecutive tokens.");
    if g(&s.gpu_cache_bytes) > 0 {
        counter(
            &mut out,
            "foxlm_relocations_total",
            "Moves of the running rows to a fresh GPU cache.",
            g(&s.relocations),
        );
        counter(&mut out, "foxlm_graph_steps_total", "Decode steps replayed as a CUDA graph.", g(&s.graph_steps));
        gauge(&mut out, "foxlm_gpu_cache_bytes", "The slots' decode cache on the GPU.", g(&s.gpu_cache_bytes) as f64);
        gauge(&mut out, "foxlm_gpu_memory_used_bytes", "GPU memory in use (all processes).", g(&s.gpu_mem_used) as f64);
        gauge(&mut out, "foxlm_gpu_memory_total_bytes", "GPU memory.", g(&s.gpu_mem_total) as f64);
    }
    out
}
