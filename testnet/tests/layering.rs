//! The source layout holds what README promises: no import circle inside
//! `gossip/src/p2p` or `testnet/src`, and no non-test source file of the
//! workspace over the size that reads in one sitting.
//!
//! A module imports another when its code names a path into it (`use`
//! items, or `crate::`/`super::`/`self::` paths in code, test modules left
//! out). A child naming `super::Item` of its parent's `mod.rs` imports the
//! parent, so a `mod.rs` that its children use must not use them back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines of a non-test source file (its `#[cfg(test)]` modules left
/// out).
const MAX_LINES: usize = 720;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Comments, string contents and `#[cfg(test)]` modules removed.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            i = end;
        } else if b[i..].starts_with(b"'\"'") || b[i..].starts_with(b"'\\\"'") {
            // A quote character, not a string.
            i += if b[i + 1] == b'\\' { 4 } else { 3 };
        } else if b[i..].starts_with(b"r#\"") {
            let end = text[i + 3..].find("\"#").map_or(b.len(), |e| i + 3 + e + 2);
            i = end;
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i..].starts_with(b"#[cfg(test)]") {
            // Skip the attribute and, for a module, its whole body.
            let rest = &text[i + 12..];
            let trimmed = rest.trim_start();
            if trimmed.starts_with("mod ") {
                let open = i + 12 + rest.find('{').unwrap_or(rest.len());
                let mut depth = 0usize;
                let mut j = open;
                while j < b.len() {
                    match b[j] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                j += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                i = j;
            } else {
                i += 12;
            }
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// The module path of a file under a crate's `src`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Expands `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.to_string()];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.len() - 1]);
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for ch in inner.chars() {
        match ch {
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            '{' => {
                depth += 1;
                cur.push(ch);
            }
            '}' => {
                depth -= 1;
                cur.push(ch);
            }
            _ => cur.push(ch),
        }
    }
    parts.push(cur);
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(p))
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// The paths a file's code names.
fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        let tree: String = rest[..end].chars().filter(|c| !c.is_whitespace()).collect();
        let tree = tree.replace("pub(crate)", "");
        paths.extend(expand(&tree));
    }
    for start in ["crate::", "super::", "self::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                paths.push(tail[..len].to_string());
            }
            rest = &tail[len.max(1)..];
        }
    }
    paths
}

/// The module (of `modules`) a path from module `from` points into.
fn resolve(from: &[String], path: &str, modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let path = path.split(" as ").next()?;
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<String> = from.to_vec();
    match segs.first() {
        Some(&"crate") => {
            base.clear();
            segs.remove(0);
        }
        Some(&("super" | "self")) => {
            while let Some(&s) = segs.first() {
                match s {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                segs.remove(0);
            }
        }
        Some(first) => {
            let mut child = base.clone();
            child.push(first.to_string());
            if !modules.contains(&child) {
                return None;
            }
        }
        None => return None,
    }
    let mut cur = base.clone();
    let mut best = base;
    for s in segs {
        cur.push(s.to_string());
        if modules.contains(&cur) {
            best = cur.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// The import circles among the modules of `crate_src` under `prefix`.
fn circles(crate_src: &str, prefix: &[&str]) -> Vec<Vec<String>> {
    let src = workspace().join(crate_src);
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut code: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        if text.contains("#[path") {
            out.push(vec![format!(
                "{} mounts a module with #[path]",
                f.strip_prefix(workspace()).unwrap().display()
            )]);
        }
        code.insert(module_of(&src, f), code_of(&text));
    }
    let modules: BTreeSet<Vec<String>> = code.keys().cloned().collect();
    let inside = |m: &Vec<String>| m.len() >= prefix.len() && m[..prefix.len()] == *prefix;
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, text) in code.iter().filter(|(m, _)| inside(m)) {
        let targets = named_paths(text)
            .iter()
            .filter_map(|p| resolve(m, p, &modules))
            .filter(|t| t != m && inside(t))
            .collect();
        edges.insert(m.clone(), targets);
    }
    // Two modules are in one circle when each reaches the other.
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for t in &edges[&m] {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<_, _> = edges.keys().map(|m| (m.clone(), reach(m))).collect();
    let mut placed = BTreeSet::new();
    for m in edges.keys() {
        if placed.contains(m) || !reached[m].contains(m) {
            continue;
        }
        let circle: Vec<String> = reached[m]
            .iter()
            .filter(|t| reached[*t].contains(m))
            .inspect(|t| {
                placed.insert((*t).clone());
            })
            .map(|t| t.join("::"))
            .collect();
        out.push(circle);
    }
    out
}

#[test]
fn no_import_circle_inside_the_p2p_transport_or_the_testnet() {
    for (src, prefix) in [("gossip/src", &["p2p"][..]), ("testnet/src", &[][..])] {
        let found = circles(src, prefix);
        assert!(
            found.is_empty(),
            "{src}: modules that import each other (directly or through others): {found:?}"
        );
    }
}

#[test]
fn the_checker_sees_a_circle_through_a_parent() {
    // The parent uses its child, the child names an item of the parent.
    let modules: BTreeSet<Vec<String>> = [vec![], vec!["a".to_string()]].into_iter().collect();
    let parent = named_paths(&code_of("mod a;\nuse a::Thing; // use b::x\n"));
    let child = named_paths(&code_of(
        "use super::{Other, x::{y, z}};\nfn f() { crate::Q; }",
    ));
    assert_eq!(
        resolve(&[], &parent[0], &modules),
        Some(vec!["a".to_string()])
    );
    assert_eq!(parent.len(), 1);
    assert_eq!(resolve(&["a".into()], &child[0], &modules), Some(vec![]));
    for p in ["super::Other", "super::x::y", "super::x::z", "crate::Q"] {
        assert!(child.iter().any(|c| c == p), "{p} in {child:?}");
    }
    assert!(code_of("#[cfg(test)]\nmod tests { use super::*; }\nfn g() {}").trim() == "fn g() {}");
}

#[test]
fn no_source_file_is_longer_than_one_sitting() {
    let root = workspace();
    let mut long = Vec::new();
    for krate in [
        "optim",
        "topologies",
        "gossip",
        "runspec",
        "node",
        "testnet",
    ] {
        let mut files = Vec::new();
        rust_files(&root.join(krate).join("src"), &mut files);
        for f in files {
            let name = f.file_name().unwrap().to_string_lossy();
            if name == "tests.rs" || f.components().any(|c| c.as_os_str() == "tests") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let lines = code_of(&text).lines().count();
            if lines > MAX_LINES {
                long.push(format!(
                    "{} ({lines} lines)",
                    f.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}
