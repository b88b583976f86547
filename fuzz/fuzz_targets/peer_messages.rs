//! `leasehold_server::fuzzing::peer_messages`, coverage-guided: `scripts/fuzz peer_messages`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold_server::fuzzing::peer_messages(data));
