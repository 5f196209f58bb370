//! The crate's layering (see `src/lib.rs`): the top-level modules under `src/` import one
//! another without a circle, nothing but `server` itself names `crate::server`, and `types`
//! (the collections' storage) names no protocol and nothing of the command layer or above. A circle
//! inside one folder (`engine`'s writer and blocking registry, say) is allowed; one between
//! folders fails this test with the edges that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).expect("read src");
    for e in entries {
        let path = e.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/storage/wal.rs` -> `storage`, `src/command.rs`
/// -> `command`); None for the crate root and the binaries, which sit above everything.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "lib.rs" | "main.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// The top-level modules a file's code names as `crate::name`, comments left out.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a, b::c}`: each path's first segment.
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.insert(name);
                    }
                }
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// Tarjan's strongly connected components of `graph`.
fn components(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn top_level_modules_import_each_other_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let Some(m) = module_of(&src, f) else {
            continue;
        };
        let text = std::fs::read_to_string(f).expect("read source");
        let entry = graph.entry(m.clone()).or_default();
        for to in imports(&text) {
            if to != m {
                entry.insert(to.clone());
                by_file.entry(format!("{m} -> {to}")).or_default().push(
                    f.strip_prefix(&src)
                        .expect("under src")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    assert!(
        graph.len() >= 10 && graph.contains_key("storage") && graph.contains_key("server"),
        "the walk found the crate's modules: {:?}",
        graph.keys().collect::<Vec<_>>()
    );

    let below_server: Vec<String> = by_file
        .iter()
        .filter(|(edge, _)| edge.ends_with("-> server"))
        .map(|(edge, files)| format!("{edge} ({})", files.join(", ")))
        .collect();
    assert!(
        below_server.is_empty(),
        "only `server` may name crate::server: {below_server:#?}"
    );

    // The collections are storage, protocol-neutral: typed operations and results, no reply
    // encoding (`protocol`) and nothing of the command layer or above.
    let types_above: Vec<&String> = graph
        .get("types")
        .map(|to| {
            to.iter()
                .filter(|m| {
                    ["protocol", "commands", "server", "scripting", "engine"].contains(&m.as_str())
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        graph.contains_key("types") && types_above.is_empty(),
        "`types` imports {types_above:?}"
    );

    let circles: Vec<Vec<String>> = components(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    let detail: Vec<String> = circles
        .iter()
        .flat_map(|c| {
            let set: BTreeSet<&String> = c.iter().collect();
            by_file
                .iter()
                .filter(move |(edge, _)| {
                    let (a, b) = edge.split_once(" -> ").expect("edge");
                    set.contains(&a.to_string()) && set.contains(&b.to_string())
                })
                .map(|(edge, files)| format!("{edge}: {}", files.join(", ")))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "import circles between top-level modules {circles:?}:\n{}",
        detail.join("\n")
    );
}

#[test]
fn the_import_scan_sees_groups_and_skips_comments() {
    let text = "use crate::{storage::lmdb, types};\n// crate::server\nlet x = crate::engine::writer::run; //! crate::commands\n";
    let got: Vec<String> = imports(text).into_iter().collect();
    assert_eq!(got, ["engine", "storage", "types"]);
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    let mut big: Vec<Vec<String>> = components(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    big.iter_mut().for_each(|c| c.sort());
    assert_eq!(big, vec![vec!["a".to_string(), "b".to_string()]]);
}
