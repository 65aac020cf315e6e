//! A small ordered YAML tree and its writer, enough for compose files.
//!
//! Compose files are written by hand rather than through a YAML library: the
//! tree keeps keys in the order a person reads them (image, command, network,
//! limits), and every string is written as a JSON string, which YAML reads as
//! a double-quoted scalar, so no value can be mistaken for a number, a boolean
//! or YAML syntax.

/// A YAML value whose maps keep their insertion order.
#[derive(Debug, Clone, PartialEq)]
pub enum Yaml {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    List(Vec<Yaml>),
    Map(Vec<(String, Yaml)>),
}

impl Yaml {
    /// An empty map.
    pub fn map() -> Self {
        Yaml::Map(Vec::new())
    }

    /// `self` with `key: value` appended (self must be a map).
    pub fn with(mut self, key: &str, value: impl Into<Yaml>) -> Self {
        self.insert(key, value);
        self
    }

    /// Appends `key: value` to a map; replaces the value if the key exists.
    pub fn insert(&mut self, key: &str, value: impl Into<Yaml>) {
        if let Yaml::Map(entries) = self {
            let value = value.into();
            match entries.iter_mut().find(|(k, _)| k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key.to_string(), value)),
            }
        }
    }

    /// The value at `key` of a map.
    pub fn get(&self, key: &str) -> Option<&Yaml> {
        match self {
            Yaml::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Follows a path of map keys.
    pub fn at(&self, path: &[&str]) -> Option<&Yaml> {
        path.iter().try_fold(self, |node, key| node.get(key))
    }

    /// The string of a `Str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Yaml::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items of a `List`.
    pub fn as_list(&self) -> Option<&[Yaml]> {
        match self {
            Yaml::List(items) => Some(items),
            _ => None,
        }
    }

    /// The keys of a `Map`, in order.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            Yaml::Map(entries) => entries.iter().map(|(k, _)| k.as_str()).collect(),
            _ => Vec::new(),
        }
    }

    /// The YAML text of this value as a document.
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        match self {
            Yaml::Map(entries) if !entries.is_empty() => write_map(entries, 0, &mut out),
            Yaml::List(items) if !items.is_empty() => write_list(items, 0, &mut out),
            scalar => {
                out.push_str(&inline(scalar));
                out.push('\n');
            }
        }
        out
    }
}

impl From<&str> for Yaml {
    fn from(s: &str) -> Self {
        Yaml::Str(s.to_string())
    }
}
impl From<String> for Yaml {
    fn from(s: String) -> Self {
        Yaml::Str(s)
    }
}
impl From<i64> for Yaml {
    fn from(v: i64) -> Self {
        Yaml::Int(v)
    }
}
impl From<f64> for Yaml {
    fn from(v: f64) -> Self {
        Yaml::Float(v)
    }
}
impl From<bool> for Yaml {
    fn from(v: bool) -> Self {
        Yaml::Bool(v)
    }
}
impl<T: Into<Yaml>> From<Vec<T>> for Yaml {
    fn from(items: Vec<T>) -> Self {
        Yaml::List(items.into_iter().map(Into::into).collect())
    }
}

/// A key as YAML: plain when it is a simple name, quoted otherwise.
fn key_text(key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && key.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    if plain { key.to_string() } else { quote(key) }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serialises")
}

/// A scalar or an empty or all-scalar collection on one line (flow style).
fn inline(value: &Yaml) -> String {
    match value {
        Yaml::Str(s) => quote(s),
        Yaml::Int(v) => v.to_string(),
        Yaml::Float(v) if v.is_finite() => {
            let s = v.to_string();
            if s.contains('.') || s.contains('e') {
                s
            } else {
                format!("{s}.0")
            }
        }
        Yaml::Float(_) => "null".to_string(),
        Yaml::Bool(v) => v.to_string(),
        Yaml::List(items) => {
            let parts: Vec<String> = items.iter().map(inline).collect();
            format!("[{}]", parts.join(", "))
        }
        Yaml::Map(entries) => {
            let parts: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}: {}", key_text(k), inline(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

/// Whether a value is written on its key's line.
fn is_flow(value: &Yaml) -> bool {
    match value {
        Yaml::Map(entries) => entries.is_empty(),
        Yaml::List(items) => items
            .iter()
            .all(|i| !matches!(i, Yaml::Map(_) | Yaml::List(_))),
        _ => true,
    }
}

fn write_map(entries: &[(String, Yaml)], indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    for (key, value) in entries {
        out.push_str(&pad);
        out.push_str(&key_text(key));
        out.push(':');
        if is_flow(value) {
            out.push(' ');
            out.push_str(&inline(value));
            out.push('\n');
        } else {
            out.push('\n');
            match value {
                Yaml::Map(inner) => write_map(inner, indent + 2, out),
                Yaml::List(items) => write_list(items, indent + 2, out),
                _ => unreachable!("scalars are flow"),
            }
        }
    }
}

fn write_list(items: &[Yaml], indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    for item in items {
        out.push_str(&pad);
        out.push('-');
        match item {
            Yaml::Map(inner) if !inner.is_empty() => {
                // First entry on the dash's line, the rest aligned under it.
                let mut body = String::new();
                write_map(inner, indent + 2, &mut body);
                out.push(' ');
                out.push_str(body.trim_start());
            }
            Yaml::List(inner) if !is_flow(item) => {
                out.push('\n');
                write_list(inner, indent + 2, out);
            }
            _ => {
                out.push(' ');
                out.push_str(&inline(item));
                out.push('\n');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_maps_and_lists_are_indented_in_order() {
        let doc = Yaml::map()
            .with("version", "2.4")
            .with(
                "services",
                Yaml::map().with(
                    "node0",
                    Yaml::map()
                        .with("command", vec!["node", "--steps", "3"])
                        .with("cpus", 0.5)
                        .with("volumes", Yaml::List(vec![])),
                ),
            )
            .with(
                "networks",
                Yaml::map().with(
                    "net",
                    Yaml::map().with(
                        "config",
                        Yaml::List(vec![Yaml::map().with("subnet", "10.1.0.0/24").with("x", 1)]),
                    ),
                ),
            );
        let text = doc.to_yaml();
        let expected = r#"version: "2.4"
services:
  node0:
    command: ["node", "--steps", "3"]
    cpus: 0.5
    volumes: []
networks:
  net:
    config:
      - subnet: "10.1.0.0/24"
        x: 1
"#;
        assert_eq!(text, expected);
    }

    #[test]
    fn strings_are_quoted_so_yaml_keeps_them_strings() {
        let doc = Yaml::map()
            .with("a", "yes")
            .with("b", "1.0")
            .with("c", "line1\nline2 \"q\" $x")
            .with("weird key", true)
            .with("f", 2.0);
        let text = doc.to_yaml();
        assert!(text.contains("a: \"yes\"\n"));
        assert!(text.contains("b: \"1.0\"\n"));
        assert!(text.contains(r#"c: "line1\nline2 \"q\" $x""#));
        assert!(text.contains("\"weird key\": true\n"));
        assert!(text.contains("f: 2.0\n"));
    }

    #[test]
    fn insert_replaces_and_lookups_follow_paths() {
        let mut doc = Yaml::map().with("a", Yaml::map().with("b", "x"));
        doc.insert("a", Yaml::map().with("b", "y"));
        assert_eq!(doc.keys(), vec!["a"]);
        assert_eq!(doc.at(&["a", "b"]).and_then(Yaml::as_str), Some("y"));
        assert!(doc.at(&["a", "c"]).is_none());
    }
}
