//! Nothing to generate. The build dependency on protoc-bin-vendored (with
//! the `etcd` feature, the only one that needs it) puts a protoc into
//! cargo's registry, where `tools/protoc` (the `PROTOC` of
//! `.cargo/config.toml`) finds it for etcd-client's build script on a machine
//! without protobuf-compiler.
fn main() {}
