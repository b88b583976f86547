//! Every decoder that reads the network or the disk, fed arbitrary bytes:
//! what the fuzz targets (`fuzz/`, coverage-guided with `scripts/fuzz`) and
//! the corpus replay of the tests (`tests/fuzz_corpus.rs`) both run. A
//! decoder may refuse its input, and must never panic, loop, or allocate
//! beyond what its input's own limit allows.
//!
//! | target | what it reads |
//! |---|---|
//! | `client_frames` | the framed client protocol, both ways (`leasehold_proto::frame`) |
//! | `peer_messages` | every message between peers, and a framed stream of appends |
//! | `http_bodies` | the JSON body of every HTTP call that takes one |
//! | `snapshot_file` | a snapshot file (header, meta, table) and a table's encoding |
//! | `log_segment` | a log segment's records |
//! | `dir_files` | the data dir's `format` and `cluster` files, a peer message's header |
//! | `config_file` | the TOML config file |
//! | `certificate` | the DER walk that reads a client certificate's subject |

use bytes::BytesMut;
use tokio_util::codec::Decoder;

/// A fuzz target: takes any bytes, and must not panic.
pub type Target = fn(&[u8]);

/// The targets, by name.
pub const TARGETS: &[(&str, Target)] = &[
    ("client_frames", client_frames),
    ("peer_messages", peer_messages),
    ("http_bodies", http_bodies),
    ("snapshot_file", snapshot_file),
    ("log_segment", log_segment),
    ("dir_files", dir_files),
    ("config_file", config_file),
    ("certificate", certificate),
];

/// The framed client protocol: requests as a node reads them, replies as a
/// client does.
pub fn client_frames(data: &[u8]) {
    use leasehold_proto::frame::FrameCodec;
    for mut codec in [FrameCodec::requests(), FrameCodec::replies()] {
        let mut buffer = BytesMut::from(data);
        while let Ok(Some(_)) = codec.decode(&mut buffer) {}
    }
}

/// Peers' messages (see [`crate::raft::fuzzing::peer_messages`]).
pub fn peer_messages(data: &[u8]) {
    crate::raft::fuzzing::peer_messages(data);
}

/// Every HTTP body the API decodes.
pub fn http_bodies(data: &[u8]) {
    crate::api::http::fuzz_bodies(data);
}

/// A snapshot file and a table's encoding.
pub fn snapshot_file(data: &[u8]) {
    let _ = crate::raft::fuzzing::snapshot_file(data);
}

/// A log segment.
pub fn log_segment(data: &[u8]) {
    crate::raft::fuzzing::log_segment(data);
}

/// The data dir's small files.
pub fn dir_files(data: &[u8]) {
    let _ = crate::raft::fuzzing::dir_files(data);
}

/// The config file, against flags of every kind (a value, a switch, one
/// that repeats).
pub fn config_file(data: &[u8]) {
    use crate::config_file::{to_args, Flag};
    let flag = |name: &str, takes_value, repeats| Flag {
        name: name.to_string(),
        env: None,
        takes_value,
        repeats,
    };
    let flags = [
        flag("listen", true, false),
        flag("insecure", false, false),
        flag("role-quota", true, true),
    ];
    let _ = to_args(&String::from_utf8_lossy(data), &flags);
}

/// The DER walk over a client certificate.
pub fn certificate(data: &[u8]) {
    let der = tokio_rustls::rustls::pki_types::CertificateDer::from(data);
    let _ = crate::tls::subject(&der);
}
