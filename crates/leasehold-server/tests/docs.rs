//! The pages' curl examples, run: README.md's "Try it with curl" and every
//! curl command in docs/api.md followed by the answer it shows. Each runs
//! with `sh` against a new node (its address in place of localhost:7419),
//! and its answer must be what the page shows: the same JSON, where `"..."`
//! stands for any text. A page that drifts from the server fails here.

use std::path::Path;
use std::process::Command;

use leasehold_testkit::Leaseholdd;
use serde_json::Value;

/// One command of a page and the answer it shows, if it shows one.
#[derive(Debug)]
struct Step {
    command: String,
    answer: Option<Value>,
}

fn page(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The fenced blocks of `text`: each one's language and lines.
fn blocks(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut open: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        let fence = line.trim_start();
        match &mut open {
            None if fence.starts_with("```") => {
                open = Some((fence.trim_start_matches('`').to_string(), Vec::new()));
            }
            Some(_) if fence.starts_with("```") => out.extend(open.take()),
            Some((_, lines)) => lines.push(line.to_string()),
            None => {}
        }
    }
    out
}

/// The commands of a shell block (lines joined at a trailing `\`), each
/// with the `# {json}` comment line that follows it, if one does.
fn steps(lines: &[String]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut command = String::new();
    for line in lines {
        let line = line.trim();
        if let Some(shown) = line.strip_prefix("# {") {
            let last = steps.last_mut().expect("an answer follows a command");
            let answer = serde_json::from_str(&format!("{{{shown}"))
                .unwrap_or_else(|e| panic!("the answer shown is not JSON ({e}): {line}"));
            last.answer = Some(answer);
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => command.push_str(head),
            None => {
                command.push_str(line);
                steps.push(Step {
                    command: std::mem::take(&mut command),
                    answer: None,
                });
            }
        }
    }
    steps
}

/// Whether `got` is what the page shows: the same JSON, `"..."` matching
/// any string.
fn matches(shown: &Value, got: &Value) -> bool {
    match (shown, got) {
        (Value::String(s), Value::String(_)) if s == "..." => true,
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, v)| b.get(k).is_some_and(|g| matches(v, g)))
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| matches(x, y))
        }
        (a, b) => a == b,
    }
}

/// Runs `steps` in order against a new node; each answer must match.
fn run(steps: &[Step], what: &str) {
    let server = Leaseholdd::start();
    for step in steps {
        let command = step.command.replace("localhost:7419", &server.addr);
        let out = Command::new("sh")
            .args(["-c", &command])
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{what}: `{command}`: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let got: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{what}: `{command}` answered no JSON ({e}): {text}"));
        if let Some(shown) = &step.answer {
            assert!(
                matches(shown, &got),
                "{what}: `{command}`\n the page shows {shown}\n the node answered {got}"
            );
        }
    }
}

#[test]
fn the_readmes_curl_walkthrough_answers_as_it_shows() {
    let readme = page("README.md");
    let section = readme
        .split("## Try it with curl")
        .nth(1)
        .expect("README.md has a curl walkthrough");
    let (_, lines) = blocks(section)
        .into_iter()
        .find(|(lang, _)| lang == "sh")
        .expect("a shell block");
    let steps = steps(&lines);
    assert!(
        steps.iter().filter(|s| s.answer.is_some()).count() >= 5,
        "{steps:?}"
    );
    run(&steps, "README.md");
}

#[test]
fn the_api_pages_curl_examples_answer_as_they_show() {
    let api = page("docs/api.md");
    let blocks = blocks(&api);
    // A shell block of curl commands, followed at once by a JSON block:
    // the answer to its last command.
    let mut steps = Vec::new();
    for pair in blocks.windows(2) {
        let [(lang, lines), (next, answer)] = pair else {
            continue;
        };
        if lang != "sh" || next != "json" || !lines.iter().any(|l| l.contains("curl ")) {
            continue;
        }
        let mut these = self::steps(lines);
        let answer: Value = serde_json::from_str(&answer.join("\n")).expect("a JSON answer");
        if let Some(last) = these.last_mut() {
            last.answer = Some(answer);
        }
        steps.extend(these);
    }
    assert!(steps.len() >= 2, "{steps:?}");
    run(&steps, "docs/api.md");
}

/// Every manifest names the same licence, and its texts are there.
#[test]
fn every_manifest_names_the_same_licence_and_its_texts_are_there() {
    let workspace = page("Cargo.toml");
    let python = page("clients/python/pyproject.toml");
    let licence = |text: &str| -> String {
        text.lines()
            .find_map(|l| l.trim().strip_prefix("license = "))
            .unwrap_or_else(|| panic!("no licence line in {text}"))
            .trim_matches('"')
            .to_string()
    };
    assert_eq!(licence(&workspace), "MIT OR Apache-2.0");
    assert_eq!(licence(&python), licence(&workspace));
    let npm: serde_json::Value =
        serde_json::from_str(&page("clients/typescript/package.json")).expect("package.json");
    assert_eq!(npm["license"], licence(&workspace).as_str());
    for crate_dir in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .expect("crates/")
        .filter_map(|e| e.ok())
    {
        let manifest =
            std::fs::read_to_string(crate_dir.path().join("Cargo.toml")).expect("a manifest");
        assert!(
            manifest.contains("license.workspace = true"),
            "{} names a licence of its own",
            crate_dir.path().display()
        );
    }
    // Each client's package carries the texts: a package is published
    // without the rest of the repository.
    for text in ["LICENSE-MIT", "LICENSE-APACHE"] {
        assert!(page(text).len() > 500, "{text} is there");
        for client in ["python", "go", "typescript"] {
            assert_eq!(
                page(text),
                page(&format!("clients/{client}/{text}")),
                "clients/{client}/{text} is the same text"
            );
        }
    }
}
