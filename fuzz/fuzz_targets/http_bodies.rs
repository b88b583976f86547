//! `leasehold_server::fuzzing::http_bodies`, coverage-guided: `scripts/fuzz http_bodies`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold_server::fuzzing::http_bodies(data));
