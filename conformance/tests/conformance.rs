//! The conformance suite: every scenario of `conformance/scenarios/` against
//! the Rust, Python, Go and TypeScript clients, on a single node and on a
//! 3-node cluster; then each client with a bug planted in it, which the
//! scenario named for the rule it breaks must catch.
//!
//! The Python, Go and TypeScript adapters need what `scripts/prepare-clients`
//! sets up (a virtualenv, the Go toolchain, the TypeScript client's dev
//! dependencies); `scripts/test` runs it first.

use std::path::PathBuf;
use std::sync::OnceLock;

use leasehold_conformance::{load_scenarios, run, Lang, Topology};

fn rust() -> Result<Lang, String> {
    Ok(Lang::rust(&PathBuf::from(env!(
        "CARGO_BIN_EXE_leasehold-conformance-rust"
    ))))
}

fn go() -> Result<Lang, String> {
    static BUILT: OnceLock<(tempfile::TempDir, Result<Lang, String>)> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = tempfile::TempDir::new().expect("a temporary directory");
            let lang = Lang::go(dir.path());
            (dir, lang)
        })
        .1
        .clone()
}

fn typescript() -> Result<Lang, String> {
    static BUILT: OnceLock<Result<Lang, String>> = OnceLock::new();
    BUILT.get_or_init(Lang::typescript).clone()
}

/// Runs every scenario for `topology` against `lang`; fails naming each
/// scenario that failed, with why.
fn suite(lang: Result<Lang, String>, topology: Topology) {
    let lang = lang.unwrap_or_else(|e| panic!("{e}"));
    let scenarios = load_scenarios().unwrap_or_else(|e| panic!("{e}"));
    let mut failed = Vec::new();
    let mut ran = 0;
    for s in scenarios
        .iter()
        .filter(|s| s.topologies.iter().any(|t| t == topology.name()))
    {
        let outcome = run(&lang, s, topology, None);
        ran += 1;
        let verdict = if outcome.passed { "ok" } else { "FAILED" };
        eprintln!(
            "conformance {} {}: {} {verdict} ({:.1} s)",
            lang.name,
            topology.name(),
            outcome.scenario,
            outcome.took.as_secs_f64()
        );
        if !outcome.passed {
            failed.push(format!("{}: {}", outcome.scenario, outcome.detail));
        }
    }
    assert!(ran > 0, "no scenario for {}", topology.name());
    assert!(
        failed.is_empty(),
        "{} of {ran} scenarios failed for the {} client on {}:\n{}",
        failed.len(),
        lang.name,
        topology.name(),
        failed.join("\n\n")
    );
}

#[test]
fn rust_on_a_single_node() {
    suite(rust(), Topology::Single);
}

#[test]
fn rust_on_a_cluster() {
    suite(rust(), Topology::Cluster);
}

#[test]
fn python_on_a_single_node() {
    suite(Lang::python(), Topology::Single);
}

#[test]
fn python_on_a_cluster() {
    suite(Lang::python(), Topology::Cluster);
}

#[test]
fn go_on_a_single_node() {
    suite(go(), Topology::Single);
}

#[test]
fn go_on_a_cluster() {
    suite(go(), Topology::Cluster);
}

#[test]
fn typescript_on_a_single_node() {
    suite(typescript(), Topology::Single);
}

#[test]
fn typescript_on_a_cluster() {
    suite(typescript(), Topology::Cluster);
}

/// How a client under test is made ready.
type Prepare = fn() -> Result<Lang, String>;

/// Each client with a bug planted behind its test-only switch fails the
/// scenario of the rule the bug breaks (and passes it without: above).
#[test]
fn each_planted_bug_is_caught_by_the_scenario_of_its_rule() {
    let planted: [(Prepare, &str, &str); 6] = [
        (
            rust,
            "deadline-from-reply",
            "a_holder_cut_off_gives_up_before_the_server_expires_it",
        ),
        (
            Lang::python,
            "fresh-request-id",
            "a_lost_reply_is_sent_again_and_acts_once",
        ),
        (
            go,
            "release-by-name",
            "a_release_after_the_loss_leaves_the_new_holder_alone",
        ),
        (
            go,
            "deadline-from-reply",
            "a_holder_cut_off_gives_up_before_the_server_expires_it",
        ),
        (
            typescript,
            "deadline-from-reply",
            "a_holder_cut_off_gives_up_before_the_server_expires_it",
        ),
        (
            typescript,
            "release-by-name",
            "a_release_after_the_loss_leaves_the_new_holder_alone",
        ),
    ];
    let scenarios = load_scenarios().unwrap_or_else(|e| panic!("{e}"));
    let mut missed = Vec::new();
    for (lang, bug, name) in planted {
        let lang = lang().unwrap_or_else(|e| panic!("{e}"));
        let scenario = scenarios
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no scenario {name}"));
        let outcome = run(&lang, scenario, Topology::Single, Some(bug));
        let first = outcome
            .detail
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        eprintln!(
            "planted in {}: {bug}: {} by {name}{}",
            lang.name,
            if outcome.passed { "MISSED" } else { "caught" },
            if outcome.passed {
                String::new()
            } else {
                format!(" ({first})")
            }
        );
        if outcome.passed {
            missed.push(format!("{} {bug}: {name} passed", lang.name));
        }
    }
    assert!(
        missed.is_empty(),
        "planted bugs the suite missed: {missed:?}"
    );
}
