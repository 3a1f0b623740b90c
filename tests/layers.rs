//! The layers of `src/`, read from the code's own imports (issue 13).
//!
//! Every source file's references to other modules — `use crate::…`, inline `crate::a::b` paths,
//! `super::…` and a `mod.rs`'s own children — become edges between files. Two rules hold:
//! - no import runs up a layer (the order is in [`LAYERS`]);
//! - no two files import each other, directly or through others (no cycle between files). A file
//!   using what its own parent modules define (`super::Item` from a child) is not an edge: the
//!   parent is the module's interface, and Rust's privacy gives children their ancestors' items.
//!
//! Like the route test that keeps `schema/openapi.json` true, this keeps `src/lib.rs`'s layout
//! true: a change that breaks the layering fails here with the file and the line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules from the top of the program to the bottom. A module may import only modules
/// of a strictly lower rank (and itself). Modules sharing a rank may not import each other.
const LAYERS: &[(&str, u32)] = &[
    ("main", 100),
    ("cli", 90),
    // The daemon's start-up composes broker and http; only the CLI runs it.
    ("daemon", 85),
    ("scripted_model", 82),
    ("agent", 80),
    // The MCP server: tools over the typed client, beside the agent wrappers.
    ("mcp", 75),
    ("client", 70),
    ("http", 60),
    ("broker", 50),
    ("store", 40),
    ("api", 35),
    ("event", 30),
    // Configuration: files in the home, profiles, the broker's security settings.
    // Which projects' env the user trusts (reads their settings).
    ("project_trust", 23),
    ("settings", 22),
    ("trust", 21),
    ("config", 20),
    // The processes' log: on standard error, or in a private file.
    ("logging", 15),
    // Base: usable by all, importing nothing above.
    ("private_files", 12),
    ("escape", 10),
    ("time", 10),
    ("ids", 10),
    ("process", 10),
    ("secret", 10),
    ("lib", 0),
];

/// Imports that are downward yet not allowed: the client side (the CLI, the agent wrappers, the
/// typed client, the contract) talks to the broker only over the wire, through `api` types; the
/// CLI runs the broker only through `daemon`.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("cli", &["broker", "store", "http"]),
    ("scripted_model", &["broker", "store", "http", "daemon"]),
    ("agent", &["broker", "store", "http", "daemon"]),
    ("client", &["broker", "store", "http", "daemon"]),
    ("api", &["broker", "store", "http", "daemon"]),
];

fn is_forbidden(from: &str, to: &str) -> bool {
    FORBIDDEN.iter().any(|(source, targets)| *source == from && targets.contains(&to))
}

fn rank(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(name, _)| *name == module).map(|(_, rank)| *rank)
}

/// A source file and the module path it defines (`["broker", "command"]`).
struct SourceFile {
    path: PathBuf,
    module: Vec<String>,
    text: String,
}

fn source_files() -> Vec<SourceFile> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(&root).expect("under src");
                let mut module: Vec<String> =
                    relative.with_extension("").iter().map(|s| s.to_string_lossy().into_owned()).collect();
                if module.last().is_some_and(|m| m == "mod") {
                    module.pop();
                }
                if module == ["lib"] {
                    module.clear();
                }
                let text =
                    strip_inline_tests(strip_comments_and_strings(&std::fs::read_to_string(&path).expect("read")));
                files.push(SourceFile { path, module, text });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// Blanks comments, string and char literals so that only code is read (keeping line breaks).
fn strip_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && is_raw_string(&chars, i) {
            let mut hashes = 0;
            i += 1;
            while chars.get(i) == Some(&'#') {
                hashes += 1;
                i += 1;
            }
            i += 1; // the opening quote
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if chars.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && is_char_literal(&chars, i) {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_raw_string(chars: &[char], i: usize) -> bool {
    let before_is_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    if before_is_ident {
        return false;
    }
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    chars.get(j) == Some(&'"')
}

/// `'a'`, `'\n'`, `'\u{1b}'` are literals; `'a` (a lifetime) is not.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}

/// Every module path a file refers to, with the line it is on. `use crate::{a::b, c}` gives two.
fn references(file: &SourceFile) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let text = &file.text;
    let bytes = text.as_bytes();
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let starts_a_path = |at: usize| {
        at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':')
    };
    // `crate::…`, `super::…` and `self::…` paths, in `use` lines and inline.
    for anchor in ["crate::", "super::", "self::"] {
        let mut start = 0;
        while let Some(at) = text[start..].find(anchor) {
            let at = start + at;
            start = at + anchor.len();
            if !starts_a_path(at) {
                continue;
            }
            let mut base = match anchor {
                "crate::" => Vec::new(),
                _ => file.module.clone(),
            };
            if anchor == "super::" {
                base.pop();
            }
            for path in parse_tree(&text[start..], base) {
                found.push((line_of(at), path));
            }
        }
    }
    // Children declared with `mod name;` and reached by bare name: `pub use wire::X`, `wire::f()`.
    for child in declared_children(text) {
        let token = format!("{child}::");
        let mut start = 0;
        while let Some(at) = text[start..].find(&token) {
            let at = start + at;
            start = at + token.len();
            if !starts_a_path(at) {
                continue;
            }
            let mut base = file.module.clone();
            base.push(child.clone());
            for path in parse_tree(&text[start..], base) {
                found.push((line_of(at), path));
            }
        }
    }
    found
}

/// Names declared as `mod name;` (children in their own files).
fn declared_children(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "))?;
            let name = rest.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

/// Removes inline `#[cfg(test)] mod … { … }` blocks: a test module may import anything, and its
/// `super::` is the file itself.
fn strip_inline_tests(text: String) -> String {
    let mut out = text;
    while let Some(at) = out.find("#[cfg(test)]") {
        let after = &out[at..];
        let Some(brace) = after.find('{') else { break };
        let header = &after[..brace];
        let semicolon = header.find(';');
        if !header.contains("mod ") || semicolon.is_some() {
            // `#[cfg(test)] mod tests;` or a test-only item that is not a module: blank the attribute.
            out.replace_range(at..at + "#[cfg(test)]".len(), "");
            continue;
        }
        let Some(close) = matching_brace(&after[brace..]) else { break };
        let end = at + brace + close + 1;
        let newlines = out[at..end].matches('\n').count();
        out.replace_range(at..end, &"\n".repeat(newlines));
    }
    out
}

/// Reads `a::b::{c, d::e}` from the start of `text`, giving every full path under `base`.
fn parse_tree(text: &str, base: Vec<String>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut path = base;
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("super::") {
            path.pop();
            rest = after;
            continue;
        }
        if rest.starts_with('{') {
            let Some(close) = matching_brace(rest) else {
                return out;
            };
            for part in split_top_level(&rest[1..close]) {
                let part = part.trim();
                if part.is_empty() || part == "self" {
                    if part == "self" {
                        out.push(path.clone());
                    }
                    continue;
                }
                out.extend(parse_tree(part, path.clone()));
            }
            return out;
        }
        let ident: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if ident.is_empty() {
            out.push(path);
            return out;
        }
        path.push(ident.clone());
        rest = &rest[ident.len()..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => {
                out.push(path);
                return out;
            }
        }
    }
}

fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// The file that defines the longest prefix of `path` that is a module.
fn resolve<'a>(files: &'a [SourceFile], path: &[String]) -> Option<&'a SourceFile> {
    (0..=path.len()).rev().find_map(|n| files.iter().find(|f| f.module == path[..n]))
}

fn top(module: &[String]) -> &str {
    module.first().map(String::as_str).unwrap_or("lib")
}

struct Edges {
    /// from file index → (to file index, line of the first reference)
    map: BTreeMap<usize, BTreeMap<usize, usize>>,
}

fn edges(files: &[SourceFile]) -> Edges {
    let mut map: BTreeMap<usize, BTreeMap<usize, usize>> = BTreeMap::new();
    for (from, file) in files.iter().enumerate() {
        for (line, path) in references(file) {
            let Some(target) = resolve(files, &path) else { continue };
            let to = files.iter().position(|f| std::ptr::eq(f, target)).expect("in list");
            // A file may use what its own parent modules define (Rust's privacy is built that
            // way: children see their ancestors' private items); that is not counted as an edge.
            let is_ancestor = files[to].module.len() < file.module.len()
                && file.module.starts_with(&files[to].module)
                && !files[to].module.is_empty();
            if to != from && !is_ancestor {
                map.entry(from).or_default().entry(to).or_insert(line);
            }
        }
    }
    Edges { map }
}

fn display(files: &[SourceFile], index: usize) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    files[index].path.strip_prefix(root).unwrap_or(&files[index].path).display().to_string()
}

#[test]
fn no_import_runs_up_a_layer() {
    let files = source_files();
    let edges = edges(&files);
    let mut upward = Vec::new();
    for (from, targets) in &edges.map {
        let from_top = top(&files[*from].module);
        if files[*from].path.ends_with("main.rs") && files[*from].module == ["main"] {
            continue;
        }
        for (to, line) in targets {
            let to_top = top(&files[*to].module);
            if from_top == to_top || to_top == "lib" {
                continue;
            }
            let (Some(from_rank), Some(to_rank)) = (rank(from_top), rank(to_top)) else {
                upward.push(format!(
                    "{}:{line}: module `{from_top}` or `{to_top}` has no layer in LAYERS",
                    display(&files, *from)
                ));
                continue;
            };
            if is_forbidden(from_top, to_top) {
                upward.push(format!(
                    "{}:{line} ({from_top}) imports {} ({to_top}): the client side reaches the broker only over the wire",
                    display(&files, *from),
                    display(&files, *to)
                ));
            } else if to_rank >= from_rank {
                upward.push(format!(
                    "{}:{line} ({from_top}) imports {} ({to_top}), which is not below it",
                    display(&files, *from),
                    display(&files, *to)
                ));
            }
        }
    }
    assert!(upward.is_empty(), "imports that run up a layer:\n{}", upward.join("\n"));
}

#[test]
fn no_two_files_import_each_other() {
    let files = source_files();
    let edges = edges(&files);
    let mut cycles = Vec::new();
    for component in strongly_connected(files.len(), &edges) {
        if component.len() > 1 {
            let names: BTreeSet<String> = component.iter().map(|i| display(&files, *i)).collect();
            let mut lines = Vec::new();
            for from in &component {
                for (to, line) in edges.map.get(from).into_iter().flatten() {
                    if component.contains(to) {
                        lines.push(format!("  {}:{line} → {}", display(&files, *from), display(&files, *to)));
                    }
                }
            }
            cycles.push(format!("{names:?}\n{}", lines.join("\n")));
        }
    }
    assert!(cycles.is_empty(), "import cycles between files:\n{}", cycles.join("\n\n"));
}

/// Tarjan's strongly connected components over the file graph.
fn strongly_connected(count: usize, edges: &Edges) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a Edges,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        let targets: Vec<usize> = s.edges.map.get(&v).map(|m| m.keys().copied().collect()).unwrap_or_default();
        for w in targets {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut state = State {
        edges,
        index: vec![None; count],
        low: vec![0; count],
        on_stack: vec![false; count],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..count {
        if state.index[v].is_none() {
            visit(&mut state, v);
        }
    }
    state.out
}

#[test]
fn the_reader_sees_imports_in_groups_and_relative_paths() {
    let paths = parse_tree("{a::b, c::{d, e::f}, self}", vec!["x".into()]);
    let shown: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(shown, ["x::a::b", "x::c::d", "x::c::e::f", "x"]);
    assert!(is_forbidden("client", "broker") && is_forbidden("agent", "store") && !is_forbidden("http", "broker"));
    let code = strip_comments_and_strings("let s = \"crate::http\"; // crate::cli\nuse crate::store;");
    assert!(!code.contains("crate::http") && !code.contains("crate::cli") && code.contains("crate::store"));
}
