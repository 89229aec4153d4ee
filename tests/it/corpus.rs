//! The bad-input corpus (`tests/corpus/`): every case runs its command and
//! must end with its exit code and the words its error must contain; none
//! may panic or leave an output behind. Every case directory has an entry in
//! `cases.json` and every entry a directory.

use std::collections::BTreeSet;

use crate::common::{golden, root, run};

#[test]
fn every_case_gives_its_exit_code_and_words() {
    let dir = root().join("tests/corpus");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    let listed: BTreeSet<String> = cases
        .iter()
        .map(|c| c["case"].as_str().unwrap().to_string())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        listed, on_disk,
        "cases.json and the case directories disagree"
    );
    assert!(cases.len() >= 30);

    let mut failures = Vec::new();
    for c in cases {
        let name = c["case"].as_str().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let args: Vec<String> = c["run"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                a.as_str()
                    .unwrap()
                    .replace("{case}", dir.join(name).to_str().unwrap())
                    .replace("{tmp}", tmp.path().to_str().unwrap())
                    .replace(
                        "{golden}",
                        golden("").to_str().unwrap().trim_end_matches('/'),
                    )
            })
            .collect();
        let (bin, rest) = args.split_first().unwrap();
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        let o = run(bin, &rest);
        let err = String::from_utf8_lossy(&o.stderr);
        let want = c["exit"].as_i64().unwrap() as i32;
        let mut problems = Vec::new();
        if o.status.code() != Some(want) {
            problems.push(format!("exit {:?}, expected {want}", o.status.code()));
        }
        if err.contains("panicked") || o.status.code() == Some(101) {
            problems.push("panicked".into());
        }
        for w in c["contains"].as_array().unwrap() {
            let w = w.as_str().unwrap();
            if !err.contains(w) && !String::from_utf8_lossy(&o.stdout).contains(w) {
                problems.push(format!("no {w:?} in the message"));
            }
        }
        if want != 0 {
            let left: Vec<_> = std::fs::read_dir(tmp.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            if !left.is_empty() {
                problems.push(format!("left outputs behind: {left:?}"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{name}: {}\n  stderr: {}",
                problems.join("; "),
                err.trim()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
