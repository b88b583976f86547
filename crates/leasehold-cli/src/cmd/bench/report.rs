//! The report: ops, rate and latency percentiles, as text or JSON.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::{Args, Shared};

pub(super) fn report(
    a: &Args,
    shared: &Shared,
    elapsed: Duration,
    extra: serde_json::Map<String, serde_json::Value>,
) {
    let h = shared
        .histogram
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    let ops = shared.ops.load(Ordering::Relaxed);
    let errors = shared.errors.lock().map(|e| e.clone()).unwrap_or_default();
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let rate = ops as f64 / elapsed.as_secs_f64();
    let mut out = json!({
        "backend": a.endpoint.split("://").next().unwrap_or(""),
        "endpoint": a.endpoint,
        "workload": format!("{:?}", a.workload).to_lowercase(),
        "clients": a.clients,
        "seconds": elapsed.as_secs_f64(),
        "ops": ops,
        "ops_per_sec": rate,
        "latency_ms": { "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "p999": ms(0.999), "max": h.max() as f64 / 1000.0 },
        "errors": errors,
    });
    if let Some(o) = out.as_object_mut() {
        o.extend(extra);
    }
    if a.json {
        println!("{out}");
        return;
    }
    println!(
        "{} {:?}, {} clients, {:.1}s",
        a.endpoint,
        a.workload,
        a.clients,
        elapsed.as_secs_f64()
    );
    println!("  {ops} ops, {rate:.0} ops/s");
    if let Some(setup) = out["setup_seconds"].as_f64().filter(|s| *s >= 0.05) {
        println!(
            "  setup before the measured window: {setup:.1}s (connecting, granting; not counted)"
        );
    }
    println!(
        "  latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        ms(0.999),
        h.max() as f64 / 1000.0
    );
    if !errors.is_empty() {
        println!("  errors: {errors:?}");
    }
    for (k, v) in out.as_object().into_iter().flatten() {
        if k.starts_with("server_")
            || k.starts_with("renewals_")
            || k.starts_with("sessions")
            || k == "bytes_per_held_lock"
        {
            println!("  {k}: {v}");
        }
    }
}
