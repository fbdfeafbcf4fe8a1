//! Percentiles and this process's memory.

use std::time::Duration;

pub struct Stats {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

pub fn stats(samples: &[Duration]) -> Stats {
    let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| -> f64 {
        if us.is_empty() {
            return f64::NAN;
        }
        let i = ((us.len() as f64 - 1.0) * p).round() as usize;
        us[i.min(us.len() - 1)]
    };
    Stats {
        n: us.len(),
        p50: pct(0.50),
        p90: pct(0.90),
        p99: pct(0.99),
        mean: us.iter().sum::<f64>() / us.len().max(1) as f64,
        min: us.first().copied().unwrap_or(f64::NAN),
        max: us.last().copied().unwrap_or(f64::NAN),
    }
}

/// The median of `v` (the upper one of an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Time on a CPU of this process's threads but the main one (the benchmark client runs there;
/// the in-process gateway's workers, transcript writer and SQLite threads are the others), from
/// `/proc/self/task/*/schedstat` (nanoseconds; a thread gone since is not counted).
pub fn gateway_cpu() -> Duration {
    let main = std::process::id().to_string();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter(|t| t.file_name().to_str() != Some(main.as_str()))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
        .sum();
    Duration::from_nanos(ns)
}
