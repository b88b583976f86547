//! `leasehold_server::fuzzing::snapshot_file`, coverage-guided: `scripts/fuzz snapshot_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold_server::fuzzing::snapshot_file(data));
