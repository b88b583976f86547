//! Generates the gRPC types from `proto/` with protox, a protobuf compiler
//! written in Rust, so building needs nothing but cargo. `proto` here is a
//! link to the repository's `proto/`, so a packaged crate carries the files.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/leasehold.proto");
    println!("cargo:rerun-if-changed=proto/raft.proto");
    let descriptors = protox::compile(["leasehold.proto", "raft.proto"], ["proto"])?;
    // For gRPC server reflection (grpcurl and the like need no .proto file).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptors.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_build::configure()
        .codec_path("crate::codec::ProstCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
