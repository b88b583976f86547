//! Scenarios as data: each file of `conformance/scenarios/` is one JSON
//! object: its `name`, the `rule` it holds a client to, the `topologies`
//! it runs on, the `clients` it starts (each one adapter process), and its
//! `steps`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// One scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name, which a failure names.
    pub name: String,
    /// The rule it checks, in one sentence.
    pub rule: String,
    /// `single`, `cluster`, or both.
    pub topologies: Vec<String>,
    /// The clients by name, each with its options (`endpoints`, `proxy`).
    pub clients: BTreeMap<String, Value>,
    /// Extra `leaseholdd` flags for every node.
    pub node_args: Vec<String>,
    /// The steps, in order.
    pub steps: Vec<Value>,
    /// The file it came from.
    pub path: PathBuf,
}

/// The scenarios directory of this crate.
pub fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// Every scenario, in file-name order; an unreadable one is an error that
/// names its file.
pub fn load_scenarios() -> Result<Vec<Scenario>, String> {
    let dir = scenarios_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files.iter().map(|p| parse(p)).collect()
}

fn parse(path: &Path) -> Result<Scenario, String> {
    let at = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {at}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{at}: {e}"))?;
    let text_of = |name: &str| -> Result<String, String> {
        v.get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("{at}: no {name:?}"))
    };
    let strings = |name: &str, default: &[&str]| -> Result<Vec<String>, String> {
        match v.get(name) {
            None => Ok(default.iter().map(|s| s.to_string()).collect()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| format!("{at}: {name:?} is a list of strings")),
            Some(_) => Err(format!("{at}: {name:?} is a list of strings")),
        }
    };
    let clients = match v.get("clients") {
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        _ => return Err(format!("{at}: \"clients\" is an object of client names")),
    };
    let steps = match v.get("steps") {
        Some(Value::Array(steps)) if !steps.is_empty() => steps.clone(),
        _ => return Err(format!("{at}: \"steps\" is a list of steps")),
    };
    let topologies = strings("topologies", &["single", "cluster"])?;
    if let Some(t) = topologies
        .iter()
        .find(|t| !["single", "cluster"].contains(&t.as_str()))
    {
        return Err(format!("{at}: unknown topology {t:?}"));
    }
    Ok(Scenario {
        name: text_of("name")?,
        rule: text_of("rule")?,
        topologies,
        clients,
        node_args: strings("node_args", &[])?,
        steps,
        path: path.to_path_buf(),
    })
}
