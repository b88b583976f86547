//! The checker over real processes: a short chaos run on a 3-node cluster
//! of `leaseholdd` processes finds nothing, and the same run with clients
//! that ignore their lease is caught.

use std::path::Path;
use std::time::Duration;

use leasehold_sim::chaos::{run, ChaosConfig};

fn chaos_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_leasehold-chaos"))
}

#[test]
fn a_short_chaos_run_on_real_processes_keeps_every_property() {
    let config = ChaosConfig {
        seed: 7,
        faulty: Duration::from_secs(24),
        healthy: Duration::from_secs(8),
        ..ChaosConfig::default()
    };
    let report = run(&config, chaos_bin()).expect("chaos run");
    assert!(
        report.verdict.violations.is_empty(),
        "violations: {:#?}\nhistory and logs in {:?}",
        report.verdict.violations,
        report.kept
    );
    // The run did something worth checking: faults of several kinds, grants,
    // writes admitted.
    assert!(report.faults.len() >= 2, "faults: {:?}", report.faults);
    assert!(report.grants >= 10, "grants: {}", report.grants);
    assert!(report.writes.0 >= 10, "writes: {:?}", report.writes);
    assert!(report.reads >= 5, "reads: {}", report.reads);
}

#[test]
fn clients_that_ignore_their_lease_are_caught() {
    let config = ChaosConfig {
        seed: 3,
        faulty: Duration::from_secs(16),
        healthy: Duration::from_secs(4),
        clients_only: true,
        blind: true,
        ..ChaosConfig::default()
    };
    let report = run(&config, chaos_bin()).expect("chaos run");
    assert!(
        report
            .verdict
            .violations
            .iter()
            .any(|v| v.contains("two holders")),
        "not caught: faults {:?}, violations {:?}",
        report.faults,
        report.verdict.violations
    );
}
