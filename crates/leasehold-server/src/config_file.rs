//! `leaseholdd --config FILE`: a TOML file that can hold every flag.
//!
//! Keys are the flags' long names (`listen`, `data-dir`, `snapshot-every`;
//! `data_dir` works too). Values are what the flag takes: strings, numbers
//! and booleans (`insecure = true`); durations as strings (`"50ms"`); peers
//! as `"1=a:7419,2=b:7419"` or a table (`[peers]` with `1 = "a:7419"`). The
//! file becomes command-line arguments placed before the real ones, so a flag
//! given on the command line wins, and so does a flag's environment variable
//! when it is set; an unknown key is an error that names the keys there are.

/// A flag the file may set.
#[derive(Debug, Clone)]
pub struct Flag {
    /// Its long name.
    pub name: String,
    /// Its environment variable, if it has one.
    pub env: Option<String>,
    /// Whether it takes a value (`false`: a switch such as `--insecure`).
    pub takes_value: bool,
    /// Whether it may be given more than once (`--role-quota`), so the file
    /// may hold an array of its values.
    pub repeats: bool,
}

/// The arguments the file's settings stand for.
pub fn to_args(text: &str, flags: &[Flag]) -> Result<Vec<String>, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("{e}"))?;
    let mut args = Vec::new();
    for (key, value) in &table {
        let name = key.replace('_', "-");
        let Some(flag) = flags.iter().find(|f| f.name == name) else {
            let names: Vec<&str> = flags.iter().map(|f| f.name.as_str()).collect();
            return Err(format!(
                "unknown setting {key:?}; the settings are: {}",
                names.join(", ")
            ));
        };
        if flag
            .env
            .as_ref()
            .is_some_and(|env| std::env::var_os(env).is_some())
        {
            continue;
        }
        if !flag.takes_value {
            match value {
                toml::Value::Boolean(true) => args.push(format!("--{name}")),
                toml::Value::Boolean(false) => {}
                other => return Err(format!("{key} takes true or false, not {other}")),
            }
            continue;
        }
        // A flag given more than once (`--role-quota`): an array of values.
        if let toml::Value::Array(items) = value {
            if !flag.repeats {
                return Err(format!("{key} takes one value, not an array"));
            }
            for item in items {
                let text = match item {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    other => return Err(format!("{key} holds {other}; give strings")),
                };
                args.push(format!("--{name}"));
                args.push(text);
            }
            continue;
        }
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Table(t) => t
                .iter()
                .map(|(k, v)| match v {
                    toml::Value::String(s) => Ok(format!("{k}={s}")),
                    other => Err(format!("{key}.{k} must be a string, not {other}")),
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(","),
            other => return Err(format!("{key} cannot be {other}")),
        };
        args.push(format!("--{name}"));
        args.push(text);
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Vec<Flag> {
        let flag = |name: &str, env: Option<&str>, takes_value| Flag {
            name: name.into(),
            env: env.map(Into::into),
            takes_value,
            repeats: name == "role-quota",
        };
        vec![
            flag("listen", Some("LEASEHOLD_TEST_UNSET_LISTEN"), true),
            flag("data-dir", None, true),
            flag("snapshot-every", None, true),
            flag("peers", None, true),
            flag("heartbeat", None, true),
            flag("insecure", None, false),
            flag("role-quota", None, true),
        ]
    }

    #[test]
    fn an_array_gives_the_flag_once_for_each_value() {
        let text = r#"role-quota = ["batch=leases:10", "web=rate:50"]"#;
        assert_eq!(
            to_args(text, &flags()).expect("args"),
            [
                "--role-quota",
                "batch=leases:10",
                "--role-quota",
                "web=rate:50"
            ]
        );
        assert!(to_args("role-quota = [1.5]", &flags()).is_err());
    }

    #[test]
    fn settings_become_flags() {
        let text = r#"
            listen = "127.0.0.1:7500"
            data_dir = "/var/lib/leasehold"
            snapshot-every = 5000
            heartbeat = "20ms"
            insecure = true
            [peers]
            1 = "a:7419"
            2 = "b:7419"
        "#;
        assert_eq!(
            to_args(text, &flags()).expect("args"),
            [
                "--data-dir",
                "/var/lib/leasehold",
                "--heartbeat",
                "20ms",
                "--insecure",
                "--listen",
                "127.0.0.1:7500",
                "--peers",
                "1=a:7419,2=b:7419",
                "--snapshot-every",
                "5000",
            ]
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let unknown = to_args("lisen = \"x\"", &flags()).unwrap_err();
        assert!(
            unknown.contains("\"lisen\"") && unknown.contains("listen"),
            "{unknown}"
        );
        let switch = to_args("insecure = \"yes\"", &flags()).unwrap_err();
        assert!(switch.contains("true or false"), "{switch}");
        assert!(to_args("listen = ", &flags()).is_err());
        let array = to_args("listen = [\"a\", \"b\"]", &flags()).unwrap_err();
        assert!(array.contains("one value"), "{array}");
    }
}
