//! `leasehold_server::fuzzing::certificate`, coverage-guided: `scripts/fuzz certificate`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold_server::fuzzing::certificate(data));
