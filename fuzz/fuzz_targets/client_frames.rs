//! `leasehold_server::fuzzing::client_frames`, coverage-guided: `scripts/fuzz client_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold_server::fuzzing::client_frames(data));
