//! The documentation holds to the code: docs/cli.md against the binaries'
//! `--help`, docs/ane-rules.md against the residency checker's rule table,
//! and the JSON schemas of docs/schemas/ against what `build` writes (the
//! gate tests validate reports and acceptance records too).
//!
//! `ANE_EXPORT_UPDATE_DOCS=1 cargo test --release docs::` rewrites the help
//! blocks of docs/cli.md from the binaries instead of comparing them.

use std::path::Path;

use serde_json::Value;

use crate::common::{assert_schema, build_tiny, root, run, schema_errors};

/// Every `<!-- help: BIN [SUB] -->` marker of docs/cli.md, followed by a
/// ```text block, with that block's content.
fn help_blocks(md: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = md[at..].find("<!-- help: ") {
        let start = at + i + "<!-- help: ".len();
        let end = start + md[start..].find(" -->").expect("marker closes");
        let cmd = md[start..end].to_string();
        let fence = end
            + md[end..]
                .find("```text\n")
                .expect("a ```text block follows the marker")
            + 8;
        let close = fence + md[fence..].find("```\n").expect("the block closes");
        out.push((cmd, fence..close));
        at = close;
    }
    out
}

fn help(cmd: &str) -> String {
    let mut parts = cmd.split_whitespace();
    let bin = parts.next().unwrap();
    let mut args: Vec<&str> = parts.collect();
    args.push("--help");
    let o = run(bin, &args);
    assert!(o.status.success(), "{cmd} --help failed");
    String::from_utf8(o.stdout).unwrap()
}

/// The subcommands a binary's `--help` lists (without `help`).
fn subcommands(top_help: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut on = false;
    for l in top_help.lines() {
        if l.starts_with("Commands:") {
            on = true;
            continue;
        }
        if on {
            if !l.starts_with("  ") {
                break;
            }
            let name = l.split_whitespace().next().unwrap().to_string();
            if name != "help" {
                v.push(name);
            }
        }
    }
    v
}

#[test]
fn cli_md_is_the_binaries_help() {
    let path = root().join("docs/cli.md");
    let md = std::fs::read_to_string(&path).unwrap();
    let blocks = help_blocks(&md);
    let update = std::env::var_os("ANE_EXPORT_UPDATE_DOCS").is_some();
    let mut fresh = md.clone();
    for (cmd, range) in blocks.iter().rev() {
        let want = help(cmd);
        if update {
            fresh.replace_range(range.clone(), &want);
        } else {
            assert_eq!(
                &md[range.clone()],
                want,
                "docs/cli.md's help of `{cmd}` differs from the binary's: \
                 run ANE_EXPORT_UPDATE_DOCS=1 cargo test --release docs::"
            );
        }
    }
    if update {
        std::fs::write(&path, fresh).unwrap();
    }
    // Every command of both binaries is there.
    let documented: Vec<&str> = blocks.iter().map(|b| b.0.as_str()).collect();
    for bin in ["ane-export", "ane-run"] {
        assert!(
            documented.contains(&bin),
            "docs/cli.md lacks `{bin} --help`"
        );
        let subs = subcommands(&help(bin));
        assert!(subs.len() >= 4, "{bin}: {subs:?}");
        for s in subs {
            let cmd = format!("{bin} {s}");
            assert!(
                documented.contains(&cmd.as_str()),
                "docs/cli.md lacks `{cmd} --help`"
            );
        }
    }
}

#[test]
fn ane_rules_md_is_the_checkers_table() {
    use ane_export::gate::residency::RULES;
    let md = std::fs::read_to_string(root().join("docs/ane-rules.md")).unwrap();
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| R")).collect();
    assert_eq!(rows.len(), RULES.len(), "one table row per rule");
    for r in RULES {
        let row = format!("| {} | {} | {} |", r.id, r.name, r.source);
        assert!(
            rows.contains(&row.as_str()),
            "docs/ane-rules.md lacks\n{row}"
        );
    }
}

fn read(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A fresh build's manifest matches its schema, and the schema is not
/// hollow: each broken copy of it is rejected, naming the field.
#[test]
fn manifest_schema_holds_builds_and_rejects_broken_manifests() {
    let t = tempfile::tempdir().unwrap();
    let a = build_tiny(t.path(), "tiny", &["b1024"], &[]);
    let m = read(&a.join("manifest.json"));
    assert_schema("manifest", &m);
    type Edit = fn(&mut Value);
    let broken: [(&str, Edit); 6] = [
        ("files", |m| {
            m.as_object_mut().unwrap().remove("files");
        }),
        ("/files", |m| {
            let f = m["files"].as_object_mut().unwrap();
            let k = f.keys().next().unwrap().clone();
            f[&k] = "not-a-sha".into();
        }),
        ("/family", |m| m["family"] = "siglip3".into()),
        ("/buckets/0/patches", |m| {
            m["buckets"][0]["patches"] = 257.into()
        }),
        ("/weights", |m| m["weights"] = "int4".into()),
        ("/gates", |m| {
            m["gates"] = serde_json::json!({"accepted": true})
        }),
    ];
    for (field, edit) in broken {
        let mut bad = m.clone();
        edit(&mut bad);
        let errs = schema_errors("manifest", &bad);
        assert!(
            errs.iter().any(|e| e.contains(field)),
            "a manifest broken at {field} passed or was blamed elsewhere: {errs:?}"
        );
    }
}

#[test]
fn report_schema_rejects_broken_reports() {
    // The smallest report the schema allows is checked by the gate tests on
    // real runs; here, that it refuses what a report must not be.
    let schema = read(&root().join("docs/schemas/report.schema.json"));
    assert_eq!(
        schema["properties"]["schema"]["const"],
        "ane-export-gate-report/1"
    );
    let errs = schema_errors(
        "report",
        &serde_json::json!({"schema": "ane-export-gate-report/1"}),
    );
    for field in ["gates", "accepted", "artifact_digest"] {
        assert!(errs.iter().any(|e| e.contains(field)), "{field}: {errs:?}");
    }
}
