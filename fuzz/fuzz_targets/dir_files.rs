//! `leasehold_server::fuzzing::dir_files`, coverage-guided: `scripts/fuzz dir_files`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold_server::fuzzing::dir_files(data));
