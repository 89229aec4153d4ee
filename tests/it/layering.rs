//! The house's layering, read from the sources: every arrow between src/'s
//! top-level modules points down (no cycle), the ground floor imports no
//! stage, a checkpoint knows no family, and in each family's folder the
//! reference shares nothing with the layout and the host inputs (the cosine
//! gate compares two independent implementations only if they do not).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that import no stage: errors, named values, the BLAS, tensor
/// files, the tool's home.
const GROUND: &[&str] = &[
    "acceptance",
    "blas",
    "error",
    "home",
    "named",
    "tensor_file",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's code: comments and its test module dropped.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a piece of code names: `crate::m` and the `m` of
/// `crate::{m, ...}`.
fn named_modules(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let names: Vec<&str> = if let Some(list) = rest.strip_prefix('{') {
            let end = list.find('}').unwrap_or(list.len());
            list[..end]
                .split(',')
                .map(|s| s.trim().split("::").next().unwrap_or(""))
                .collect()
        } else {
            vec![
                rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or(""),
            ]
        };
        out.extend(
            names
                .into_iter()
                .filter(|n| modules.contains(*n))
                .map(str::to_string),
        );
    }
    out
}

/// src/'s top-level modules and what each imports (itself excluded).
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut modules = BTreeSet::new();
    for e in std::fs::read_dir(&root).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_str().unwrap().to_string();
        if name != "lib"
            && name != "bin"
            && (p.is_dir() || p.extension().is_some_and(|x| x == "rs"))
        {
            modules.insert(name);
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    for f in files {
        let rel = f.strip_prefix(&root).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let top = top.strip_suffix(".rs").unwrap_or(top).to_string();
        if !modules.contains(&top) {
            continue;
        }
        let deps = named_modules(&code(&f), &modules);
        graph
            .get_mut(&top)
            .unwrap()
            .extend(deps.into_iter().filter(|d| *d != top));
    }
    graph
}

/// The cycles of a graph: its strongly connected components of more than one node.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    // Reachability closure; two nodes share a cycle when each reaches the other.
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for d in graph.get(&n).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|k| (k, reach(k))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for a in graph.keys() {
        let scc: BTreeSet<String> = graph
            .keys()
            .filter(|b| *b == a || (reaches[a].contains(*b) && reaches[*b].contains(a)))
            .cloned()
            .collect();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let found = cycles(&g(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].iter().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert!(cycles(&g(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    let names: BTreeSet<String> = ["error", "family"].map(String::from).into();
    assert_eq!(
        named_modules(
            "use crate::{error::Result, family::Model};\n crate::blas::x()",
            &names
        ),
        names
    );
}

#[test]
fn no_import_cycle_among_top_level_modules() {
    let graph = module_graph();
    assert!(graph.len() > 15, "{:?}", graph.keys());
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "import cycles among src/'s modules: {found:?}"
    );
}

#[test]
fn the_ground_floor_imports_no_stage() {
    let graph = module_graph();
    for m in GROUND {
        let deps = &graph[*m];
        let stages: Vec<&String> = deps
            .iter()
            .filter(|d| !GROUND.contains(&d.as_str()))
            .collect();
        assert!(stages.is_empty(), "src/{m} imports stages {stages:?}");
    }
    // A checkpoint is opened without knowing its family.
    assert!(
        !graph["checkpoint"].contains("family"),
        "{:?}",
        graph["checkpoint"]
    );
}

#[test]
fn a_family_s_reference_shares_nothing_with_its_layout_and_host() {
    let dir = src().join("family");
    let mut checked = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if !p.is_dir() {
            continue;
        }
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        let reference = code(&p.join("reference.rs"));
        let layout = code(&p.join("layout.rs"));
        let host = code(&p.join("host.rs"));
        let artifact_side = &["reference::", "crate::reference", "Tower"][..];
        for (file, text, other) in [
            (
                "reference.rs",
                &reference,
                &["layout::", "host::", "crate::export", "crate::host"][..],
            ),
            ("layout.rs", &layout, artifact_side),
            ("host.rs", &host, artifact_side),
        ] {
            for o in other {
                assert!(
                    !text.contains(o),
                    "family/{name}/{file} names `{o}`: the reference and the artifact side must stay independent"
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 7, "{checked} family folders");
    // The shared halves too.
    let mut files = Vec::new();
    rust_files(&src().join("reference"), &mut files);
    for f in &files {
        let c = code(f);
        assert!(
            !c.contains("crate::export") && !c.contains("crate::host"),
            "{}",
            f.display()
        );
    }
    let mut files = Vec::new();
    rust_files(&src().join("export"), &mut files);
    for f in &files {
        assert!(!code(f).contains("crate::reference"), "{}", f.display());
    }
}
