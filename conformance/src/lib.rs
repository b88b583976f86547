//! The conformance suite's harness: it runs the scenarios of
//! `conformance/scenarios/` against one client at a time, through that
//! client's adapter (a small program that takes commands as JSON lines on
//! stdin and answers on stdout), on real `leaseholdd` processes and real
//! faults that it owns: SIGSTOP and SIGCONT, `kill -9` of the leader, a
//! fault proxy that loses, slows or swallows traffic, and an operator's
//! calls straight to the HTTP API. `conformance/README.md` is the protocol
//! and the step language.

mod adapter;
mod run;
mod scenario;

pub use adapter::Lang;
pub use run::{run, Outcome, Topology};
pub use scenario::{load_scenarios, Scenario};
