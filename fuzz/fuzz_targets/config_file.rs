//! `leasehold_server::fuzzing::config_file`, coverage-guided: `scripts/fuzz config_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold_server::fuzzing::config_file(data));
