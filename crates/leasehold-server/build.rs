//! Turns the OpenAPI document (`openapi.yaml`, a link to the repository's
//! `docs/openapi.yaml`) into the JSON that `GET /openapi.json` serves, so
//! the document and the server are one build and cannot drift apart. A
//! document that does not parse fails the build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=openapi.yaml");
    let yaml = std::fs::read_to_string("openapi.yaml")?;
    let document: serde_json::Value = serde_yaml::from_str(&yaml)?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("openapi.json"), serde_json::to_vec(&document)?)?;
    Ok(())
}
