//! `leasehold_server::fuzzing::log_segment`, coverage-guided: `scripts/fuzz log_segment`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold_server::fuzzing::log_segment(data));
