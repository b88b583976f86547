//! Takes every ```rust block of the repository's README.md and docs/*.md
//! and writes each into `$OUT_DIR/examples.rs` as the body of an async
//! function (named after its page and line) with a client called `locks`
//! and the placeholders the pages use (`crate::prelude`). A block marked
//! ```rust,ignore is left out. So a page's example that stops compiling
//! fails the build, where a reader would have found it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// Each ```rust block of `text`: the line it starts on, and its lines.
fn blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        match &mut open {
            None if fence == "```rust" => open = Some((i + 1, String::new())),
            Some(_) if fence.starts_with("```") => out.extend(open.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    out
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = String::new();
    println!("cargo:rerun-if-changed={}", root.join("docs").display());
    for page in pages(&root) {
        println!("cargo:rerun-if-changed={}", page.display());
        let text = std::fs::read_to_string(&page).expect("read a page");
        let name: String = page
            .file_name()
            .expect("a file")
            .to_string_lossy()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        for (line, body) in blocks(&text) {
            writeln!(
                out,
                "/// `{}`, the block at line {line}.\n\
                 #[allow(unused, unreachable_code, clippy::all)]\n\
                 pub async fn {name}_{line}(locks: leasehold::Client) -> anyhow::Result<()> {{\n\
                 use crate::prelude::*;\n\
                 let (ledger, entries) = (Ledger, entries());\n\
                 {{\n{body}}}\n\
                 Ok(())\n}}\n",
                page.strip_prefix(&root).unwrap_or(&page).display()
            )
            .expect("write");
        }
    }
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("examples.rs");
    std::fs::write(dest, out).expect("write examples.rs");
}
