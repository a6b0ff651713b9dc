//! The module graph has no cycles (issue 22): a test that reads `src/`, finds
//! every module-to-module reference (`use crate::…`, `use super::…`, and
//! `crate::x::y` / `super::x` paths in code) and fails on any cycle.
//!
//! At each level of the module tree the direct children of one module are the
//! nodes (the top-level modules under the crate root, the files of `admin/`
//! under `admin`, …); a reference from anything inside child `a` to anything
//! inside sibling `b` is the arrow `a → b`. A module using its own submodules or
//! its ancestors is containment, not an arrow. Any strongly connected set of
//! siblings is reported with one file and line per arrow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from the crate root (`["store", "graph", "knowledge"]`).
type ModPath = Vec<String>;

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// Rust source to tokens, without comments, string/char literals and numbers;
/// each token with its line.
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |i: usize| b.get(i).copied().unwrap_or('\0');
    while i < b.len() {
        let c = b[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if at(i) == '\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 1;
        } else if (c == 'r' || c == 'b') && raw_string_start(&b, i).is_some() {
            let (open_end, hashes) = raw_string_start(&b, i).unwrap();
            i = open_end;
            loop {
                if i >= b.len() {
                    break;
                }
                if b[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                    i += 1 + hashes;
                    break;
                }
                if b[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
        } else if c == 'b' && at(i + 1) == '"' {
            i += 1; // the string arm takes it from here
        } else if c == 'b' && at(i + 1) == '\'' {
            i += 1;
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 3;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            if c == 'r' && at(i + 1) == '#' {
                i += 2;
            }
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(b[start..i].iter().collect()), line));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push((Tok::Sep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// `r"`, `r#"`, `br##"` …: where the contents start and how many `#`s close it.
fn raw_string_start(b: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if b.get(j) == Some(&'b') {
        j += 1;
    }
    if b.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&'"')).then_some((j + 1, hashes))
}

/// One reference: the path as written (first segment `crate`, `self` or
/// `super`), where it is written (the inline modules around it), and its line.
struct Reference {
    path: Vec<String>,
    inline: Vec<String>,
    line: usize,
}

fn is_root(s: &str) -> bool {
    matches!(s, "crate" | "self" | "super")
}

/// Every `crate`/`self`/`super` path in one file's tokens.
fn references(toks: &[(Tok, usize)]) -> Vec<Reference> {
    let mut out = Vec::new();
    // Inline modules (`mod tests { … }`) with the brace depth they opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    let ident = |i: usize| match toks.get(i) {
        Some((Tok::Ident(s), _)) => Some(s.as_str()),
        _ => None,
    };
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            Tok::Ident(k) if k == "mod" => {
                if let (Some(name), Some((Tok::Punct('{'), _))) = (ident(i + 1), toks.get(i + 2)) {
                    inline.push((name.to_string(), depth + 1));
                }
            }
            Tok::Ident(k) if k == "use" => {
                let names: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                let mut leaves = Vec::new();
                i = use_tree(toks, i + 1, Vec::new(), &mut leaves);
                for (path, line) in leaves {
                    if path.first().is_some_and(|s| is_root(s)) {
                        out.push(Reference {
                            path,
                            inline: names.clone(),
                            line,
                        });
                    }
                }
                continue;
            }
            Tok::Ident(k) if is_root(k) && matches!(toks.get(i + 1), Some((Tok::Sep, _))) => {
                let after_dollar = i > 0 && toks[i - 1].0 == Tok::Punct('$');
                let line = toks[i].1;
                let mut path = vec![k.clone()];
                let mut j = i + 1;
                while matches!(toks.get(j), Some((Tok::Sep, _))) {
                    match ident(j + 1) {
                        Some(s) => path.push(s.to_string()),
                        None => break,
                    }
                    j += 2;
                }
                if !after_dollar {
                    let names = inline.iter().map(|(n, _)| n.clone()).collect();
                    out.push(Reference {
                        path,
                        inline: names,
                        line,
                    });
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Parses a use tree from `i` (after `use`, or inside braces) with `prefix`;
/// pushes each leaf path. Returns the index after the tree (past the `;` at the
/// top level).
fn use_tree(toks: &[(Tok, usize)], mut i: usize, prefix: Vec<String>, leaves: &mut Vec<(Vec<String>, usize)>) -> usize {
    let mut path = prefix;
    let mut line = toks.get(i).map_or(0, |t| t.1);
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Ident(s)) if s == "as" => {
                i += 2; // `as name`
            }
            Some(Tok::Ident(s)) => {
                line = toks[i].1;
                if s != "self" || path.is_empty() {
                    path.push(s.clone());
                }
                i += 1;
            }
            Some(Tok::Sep) => i += 1,
            Some(Tok::Punct('*')) => i += 1,
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    i = use_tree(toks, i, path.clone(), leaves);
                    match toks.get(i).map(|t| &t.0) {
                        Some(Tok::Punct(',')) => i += 1,
                        Some(Tok::Punct('}')) => {
                            i += 1;
                            break;
                        }
                        _ => break,
                    }
                    if matches!(toks.get(i).map(|t| &t.0), Some(Tok::Punct('}'))) {
                        i += 1;
                        break;
                    }
                }
                return skip_semicolon(toks, i);
            }
            _ => {
                leaves.push((path, line));
                return skip_semicolon(toks, i);
            }
        }
    }
}

fn skip_semicolon(toks: &[(Tok, usize)], i: usize) -> usize {
    match toks.get(i).map(|t| &t.0) {
        Some(Tok::Punct(';')) => i + 1,
        _ => i,
    }
}

/// Every library module backed by a file, with its file.
fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    fn walk(dir: &Path, at: &ModPath, out: &mut BTreeMap<ModPath, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for p in entries {
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                let mut m = at.clone();
                m.push(name);
                walk(&p, &m, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                match (at.is_empty(), name.as_str()) {
                    (true, "lib") => {
                        out.insert(Vec::new(), p);
                    }
                    (true, "main") => {} // the binary: `crate::` there is another crate
                    (_, "mod") => {
                        out.insert(at.clone(), p);
                    }
                    _ => {
                        let mut m = at.clone();
                        m.push(name);
                        out.insert(m, p);
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &Vec::new(), &mut out);
    out
}

/// The deepest file-backed module a reference lands in.
fn resolve(from: &ModPath, r: &Reference, known: &BTreeMap<ModPath, PathBuf>) -> ModPath {
    let mut here: ModPath = from.iter().chain(&r.inline).cloned().collect();
    let mut segs = r.path.iter().peekable();
    let mut base = match segs.next().map(String::as_str) {
        Some("crate") => Vec::new(),
        _ => {
            // `self` or `super`: relative to where the path is written.
            if r.path[0] == "super" {
                here.pop();
            }
            while segs.peek().is_some_and(|s| *s == "super") {
                segs.next();
                here.pop();
            }
            here
        }
    };
    for s in segs {
        base.push(s.clone());
    }
    while !known.contains_key(&base) {
        base.pop();
    }
    base
}

/// One arrow between siblings, with where it was seen.
type Edges = BTreeMap<(String, String), String>;

/// For each module, the arrows between its direct children.
fn sibling_graphs(src: &Path) -> BTreeMap<ModPath, Edges> {
    let known = modules(src);
    let mut graphs: BTreeMap<ModPath, Edges> = BTreeMap::new();
    for (from, file) in &known {
        let text = std::fs::read_to_string(file).unwrap();
        for r in references(&tokenize(&text)) {
            let to = resolve(from, &r, &known);
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // the same module, a descendant or an ancestor
            }
            let key = (from[common].clone(), to[common].clone());
            let seen = format!("{}:{} ({})", file.display(), r.line, r.path.join("::"));
            graphs
                .entry(from[..common].to_vec())
                .or_default()
                .entry(key)
                .or_insert(seen);
        }
    }
    graphs
}

/// Strongly connected sets of more than one node (Tarjan).
fn cycles(edges: &Edges) -> Vec<Vec<String>> {
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        adj.entry(a).or_default().push(b);
        adj.entry(b).or_default();
    }
    struct T<'a> {
        adj: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for &w in &t.adj[v] {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut set = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                set.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                t.out.push(set);
            }
        }
    }
    let mut t = T {
        adj: &adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in adj.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// Cycles known and not yet broken: (parent module, the siblings, why). The
/// check fails on any other cycle, and on a known one that grows or is gone
/// (then delete its line).
const KNOWN: &[(&str, &[&str], &str)] = &[];

/// Every cycle in the crate's module graph, described for a reader.
fn report(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for (parent, edges) in sibling_graphs(src) {
        let under = if parent.is_empty() {
            "crate".to_string()
        } else {
            format!("crate::{}", parent.join("::"))
        };
        for set in cycles(&edges) {
            let known = KNOWN
                .iter()
                .any(|(p, names, _)| *p == under.as_str() && set.iter().map(String::as_str).eq(names.iter().copied()));
            if known {
                continue;
            }
            let mut s = format!("cycle under {under} among {{{}}}:", set.join(", "));
            for ((a, b), seen) in &edges {
                if set.contains(a) && set.contains(b) {
                    s.push_str(&format!("\n    {a} → {b}: {seen}"));
                }
            }
            found.push(s);
        }
    }
    found
}

#[test]
fn module_graph_has_no_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = report(&src);
    assert!(
        found.is_empty(),
        "module import cycles (issue 22):\n{}",
        found.join("\n")
    );
    // Every known cycle is still there exactly (else its line goes).
    let graphs = sibling_graphs(&src);
    for (parent, names, _) in KNOWN {
        let at: ModPath = if *parent == "crate" {
            Vec::new()
        } else {
            parent
                .trim_start_matches("crate::")
                .split("::")
                .map(String::from)
                .collect()
        };
        let sets = graphs.get(&at).map(cycles).unwrap_or_default();
        let want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        assert!(
            sets.contains(&want),
            "the known cycle {parent}: {names:?} is gone or changed: update KNOWN in src/layering.rs"
        );
    }
}

/// The layers a search spans, lowest first (issue 49): each may use those
/// before it and never one after it. Search is the engine above the store
/// (milli's `search/` above its storage), reading it through narrow handles;
/// text analysis and the model sit below both (ingest writes the terms the
/// queries are analysed into).
const ORDER: &[&str] = &["analysis", "embed", "store", "search"];

#[test]
fn search_sits_above_the_store_and_analysis_below_both() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graphs = sibling_graphs(&src);
    let top = graphs.get(&Vec::new()).cloned().unwrap_or_default();
    let at = |m: &str| ORDER.iter().position(|o| *o == m);
    let up: Vec<String> = top
        .iter()
        .filter(|((a, b), _)| matches!((at(a), at(b)), (Some(i), Some(j)) if i < j))
        .map(|((a, b), seen)| format!("{a} → {b}: {seen}"))
        .collect();
    assert!(up.is_empty(), "imports up the search layers:\n{}", up.join("\n"));
    assert!(
        top.contains_key(&("search".to_owned(), "store".to_owned())),
        "search reads the store (the check would pass vacuously otherwise)"
    );
}

/// Names a module may not write (issue 22): the MCP layer reaches knowledge
/// only through `KnowledgeGraph` / `ScopedGraph`, never the unscoped graph,
/// the admin handle or the application state that holds them.
const FORBIDDEN: &[(&str, &[&str])] = &[("mcp", &["AdminGraph", "GraphStore", "AppState", "admin"])];

#[test]
fn the_mcp_layer_cannot_name_the_admin_handle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (module, file) in modules(&src) {
        for (prefix, names) in FORBIDDEN {
            if module.first().map(String::as_str) != Some(*prefix) {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for (tok, line) in tokenize(&text) {
                if matches!(&tok, Tok::Ident(n) if names.contains(&n.as_str())) {
                    found.push(format!("{}:{line}: {tok:?}", file.display()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the MCP layer names what it must not reach:\n{}",
        found.join("\n")
    );
}

/// Names only some modules may write (issue 22), for what Rust's visibility
/// cannot say: `Scope::from_resolver` lives beside the ids, below the auth
/// layer that alone may call it; `AdminGraph::rows_for_tests` is public for
/// the integration tests, and nothing in `src/` may run raw Cypher through it;
/// `Scope::for_tests` and `Principal::for_tests` are public for the
/// integration tests and benches (another crate: `cfg(test)` cannot reach
/// them), and nothing in `src/` but their own definitions may make a scope
/// or a principal with them; the model runtime crate is named only inside
/// `embed`, and `unsafe` written only in `memory`.
const RESERVED: &[(&str, &[&str])] = &[
    ("from_resolver", &["ids", "auth"]),
    ("rows_for_tests", &["store::graph::ingest"]),
    ("for_tests", &["ids", "auth::principal"]),
    // The in-process models are reached only through the embedding
    // boundary (issue 50): search and store see `embed::Embedder`.
    ("mnemosyne_model", &["embed"]),
    // The server crate's only `unsafe`: the allocator calls (issue 50).
    ("unsafe", &["memory"]),
];

#[test]
fn reserved_names_appear_only_where_allowed() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut defined = BTreeSet::new();
    for (module, file) in modules(&src) {
        let path = module.join("::");
        let text = std::fs::read_to_string(&file).unwrap();
        for (name, allowed) in RESERVED {
            let at_home = allowed
                .iter()
                .any(|a| path == *a || path.starts_with(&format!("{a}::")));
            for (tok, line) in tokenize(&text) {
                if matches!(&tok, Tok::Ident(n) if n == name) {
                    if at_home {
                        defined.insert(*name);
                    } else {
                        found.push(format!("{}:{line}: {name}", file.display()));
                    }
                }
            }
        }
    }
    // A renamed item would make the check vacuous.
    assert_eq!(
        defined.len(),
        RESERVED.len(),
        "a reserved name is gone: update RESERVED"
    );
    assert!(
        found.is_empty(),
        "reserved names used outside their modules:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_use_trees_paths_and_cycles() {
    let toks = tokenize(
        "use crate::{a::X, b::{self, c::Y}};\nuse super::d as e;\nfn f() { let s = \"crate::z\"; crate::q::r(); /* crate::w */ }\nmod tests { use super::*; }\nmacro_rules! m { () => { $crate::n }; }",
    );
    let refs: Vec<String> = references(&toks)
        .iter()
        .map(|r| format!("{}@{}", r.path.join("::"), r.inline.join("::")))
        .collect();
    assert_eq!(
        refs,
        [
            "crate::a::X@",
            "crate::b@",
            "crate::b::c::Y@",
            "super::d@",
            "crate::q::r@",
            "super@tests"
        ]
    );
    let mut edges = Edges::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        edges.insert((a.into(), b.into()), String::new());
    }
    assert_eq!(cycles(&edges), [vec!["a".to_string(), "b".into(), "c".into()]]);
}
