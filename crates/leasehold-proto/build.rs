fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../proto/leasehold.proto");
    tonic_build::configure().compile_protos(&["../../proto/leasehold.proto"], &["../../proto"])?;
    Ok(())
}
