//! The VQA gate: golden questions about golden images, answered by a
//! language model from the artifact's embeddings and from the reference's.
//!
//! Pass: the two agree on at least `vqa_agreement_min` of the questions and
//! the artifact's accuracy is at most `vqa_accuracy_drop_max` below the
//! reference's ([`evaluate`]). Without a language model the gate reports
//! `not_run` ([`unavailable`]), and the artifact is accepted only with
//! `--skip vqa`, which the manifest and the report record.
//!
//! Question files are JSON lines: `{"image": "path", "question": "...",
//! "answer": "..."}`, image paths relative to the file. The default set is
//! `golden/vqa/questions.jsonl` (written by `make golden-vlm`): held-out
//! easy-vqa test images and canvases composed from them, in both buckets.
//!
//! [`run`] answers each question twice with the checkpoint's language model
//! ([`crate::lm::Vlm`]), greedily: from the reference tower's visual tokens
//! and from the artifact's as executed. Each tower runs once per image.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Status;
use crate::error::{Error, Result};
use crate::lm::Vlm;
use crate::lm::features::Tower;

/// Where the gate looks for questions without `--vqa`.
pub const GOLDEN_QUESTIONS: &str = "golden/vqa/questions.jsonl";

/// Tokens generated per answer at most.
pub const MAX_ANSWER_TOKENS: usize = 16;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VqaThresholds {
    pub agreement_min: f64,
    pub accuracy_drop_max: f64,
}

/// One golden question.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    pub image: PathBuf,
    pub question: String,
    pub answer: String,
}

/// One answered question.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VqaRow {
    pub image: String,
    pub question: String,
    pub expected: String,
    pub reference: String,
    pub artifact: String,
    pub agree: bool,
    /// The bucket that ran the image on the artifact side.
    #[serde(default)]
    pub bucket: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VqaGate {
    pub status: Status,
    pub message: String,
    pub agreement: Option<f64>,
    pub accuracy_reference: Option<f64>,
    pub accuracy_artifact: Option<f64>,
    pub questions: Vec<VqaRow>,
}

/// Read a question file; errors name the file and line.
pub fn read_questions(path: &Path) -> Result<Vec<Question>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut q: Question = serde_json::from_str(line).map_err(|e| {
            Error::config(
                path,
                format!(
                    "line {}: expected {{\"image\", \"question\", \"answer\"}}: {e}",
                    i + 1
                ),
            )
        })?;
        if q.question.trim().is_empty() || q.answer.trim().is_empty() {
            return Err(Error::config(
                path,
                format!("line {}: empty question or answer", i + 1),
            ));
        }
        q.image = base.join(&q.image);
        out.push(q);
    }
    if out.is_empty() {
        return Err(Error::config(path, "no questions"));
    }
    Ok(out)
}

/// Normalise an answer for comparison: trimmed, lower case, no final full stop.
fn norm(s: &str) -> String {
    s.trim().trim_end_matches('.').trim().to_lowercase()
}

/// Judge answered questions against the thresholds.
pub fn evaluate(rows: Vec<VqaRow>, th: &VqaThresholds) -> VqaGate {
    if rows.is_empty() {
        return VqaGate {
            status: Status::Error,
            message: "no questions were answered".into(),
            agreement: None,
            accuracy_reference: None,
            accuracy_artifact: None,
            questions: rows,
        };
    }
    let n = rows.len() as f64;
    let agree = rows.iter().filter(|r| r.agree).count() as f64 / n;
    let acc = |f: fn(&VqaRow) -> &str| {
        rows.iter()
            .filter(|r| norm(f(r)) == norm(&r.expected))
            .count() as f64
            / n
    };
    let (ar, aa) = (acc(|r| &r.reference), acc(|r| &r.artifact));
    let drop = ar - aa;
    let pass = agree >= th.agreement_min && drop <= th.accuracy_drop_max + 1e-12;
    let mut message = format!(
        "agreement {:.1}% (min {:.1}%), accuracy {:.1}% from the artifact vs {:.1}% from the reference (max drop {:.1} points)",
        agree * 100.0,
        th.agreement_min * 100.0,
        aa * 100.0,
        ar * 100.0,
        th.accuracy_drop_max * 100.0
    );
    if let Some(r) = rows.iter().find(|r| !r.agree) {
        message.push_str(&format!(
            "; e.g. {} \"{}\": artifact says \"{}\", reference \"{}\"",
            r.image, r.question, r.artifact, r.reference
        ));
    }
    VqaGate {
        status: if pass { Status::Pass } else { Status::Fail },
        message,
        agreement: Some(agree),
        accuracy_reference: Some(ar),
        accuracy_artifact: Some(aa),
        questions: rows,
    }
}

/// A row from the two answers to one question.
pub fn row(q: &Question, reference: String, artifact: String) -> VqaRow {
    VqaRow {
        bucket: String::new(),
        image: q.image.display().to_string(),
        question: q.question.clone(),
        expected: q.answer.clone(),
        agree: norm(&reference) == norm(&artifact),
        reference,
        artifact,
    }
}

/// The gate when it cannot or need not run: `skipped` with `--skip vqa`,
/// else `not_run` for `why` (no language model, or a partial run). A
/// question file, when given, is still read and checked.
pub fn unavailable(questions: Option<&Path>, skipped: bool, why: &str) -> Result<VqaGate> {
    let count = questions.map(read_questions).transpose()?.map(|q| q.len());
    let (status, message) = if skipped {
        (Status::Skipped, "skipped with --skip vqa".to_string())
    } else {
        (
            Status::NotRun,
            format!(
                "{why}, so {} went unanswered; the artifact cannot be accepted without the VQA \
                 gate (--skip vqa records the skip and gates the rest)",
                count.map_or("the questions".to_string(), |n| format!(
                    "the {n} questions"
                ))
            ),
        )
    };
    Ok(VqaGate {
        status,
        message,
        agreement: None,
        accuracy_reference: None,
        accuracy_artifact: None,
        questions: vec![],
    })
}

/// The gate of a partial (`--bucket`) run: `deferred` to `--merge`, which
/// runs it over every bucket. A question file, when given, is checked now.
pub fn deferred(questions: Option<&Path>) -> Result<VqaGate> {
    questions.map(read_questions).transpose()?;
    Ok(VqaGate {
        status: Status::Deferred,
        message: "needs every bucket: runs when the partial reports are merged (--merge)".into(),
        agreement: None,
        accuracy_reference: None,
        accuracy_artifact: None,
        questions: vec![],
    })
}

/// The question file: `--vqa FILE`, else the golden set under the working directory.
pub fn question_file(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None => {
            let p = PathBuf::from(GOLDEN_QUESTIONS);
            if !p.is_file() {
                return Err(Error::Invalid(format!(
                    "no golden questions at ./{GOLDEN_QUESTIONS} (run from the project root, or pass --vqa FILE)"
                )));
            }
            Ok(p)
        }
    }
}

/// Answer every question from both towers and judge the answers.
/// `progress` is told what runs. An image that cannot be read stops the gate.
pub fn run(
    questions: &[Question],
    vlm: &Vlm,
    reference: &dyn Tower,
    artifact: &dyn Tower,
    th: &VqaThresholds,
    progress: &dyn Fn(&str),
) -> Result<VqaGate> {
    let mut rows = Vec::with_capacity(questions.len());
    let mut i = 0;
    while i < questions.len() {
        // questions about one image are answered from one run of each tower
        let img = &questions[i].image;
        let n = questions[i..]
            .iter()
            .take_while(|q| &q.image == img)
            .count();
        progress(&format!(
            "{} ({} of {} questions)",
            img.display(),
            i + n,
            questions.len()
        ));
        let r = reference.features(img)?;
        let a = artifact.features(img)?;
        for q in &questions[i..i + n] {
            let ra = vlm.answer(&r.features, &q.question, MAX_ANSWER_TOKENS)?;
            let aa = vlm.answer(&a.features, &q.question, MAX_ANSWER_TOKENS)?;
            let mut rw = row(q, ra.text, aa.text);
            rw.bucket = a.bucket.clone();
            rows.push(rw);
        }
        i += n;
    }
    Ok(evaluate(rows, th))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(answer: &str) -> Question {
        Question {
            image: "a.png".into(),
            question: "what shape?".into(),
            answer: answer.into(),
        }
    }

    #[test]
    fn agreement_and_accuracy_drop() {
        let th = VqaThresholds {
            agreement_min: 0.98,
            accuracy_drop_max: 0.01,
        };
        let all = |n: usize, wrong: usize| -> Vec<VqaRow> {
            (0..n)
                .map(|i| {
                    let a = if i < wrong { "square" } else { "circle" };
                    row(&q("circle"), "Circle.".into(), a.into())
                })
                .collect()
        };
        let g = evaluate(all(100, 0), &th);
        assert_eq!(g.status, Status::Pass);
        assert_eq!(g.agreement, Some(1.0));
        // 2 of 100 disagree: agreement 98% still passes, but accuracy drops 2 points.
        let g = evaluate(all(100, 2), &th);
        assert_eq!(g.status, Status::Fail);
        assert!(
            g.message.contains("artifact says \"square\""),
            "{}",
            g.message
        );
        // 1 of 100: agreement 99%, drop 1 point: pass.
        assert_eq!(evaluate(all(100, 1), &th).status, Status::Pass);
        assert_eq!(evaluate(vec![], &th).status, Status::Error);
    }

    #[test]
    fn question_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("q.jsonl");
        std::fs::write(
            &p,
            "{\"image\": \"a.png\", \"question\": \"what?\", \"answer\": \"circle\"}\n\n",
        )
        .unwrap();
        let qs = read_questions(&p).unwrap();
        assert_eq!(qs.len(), 1);
        assert_eq!(qs[0].image, dir.path().join("a.png"));
        std::fs::write(
            &p,
            "{\"image\": \"a.png\", \"question\": \"\", \"answer\": \"x\"}\n",
        )
        .unwrap();
        assert!(
            read_questions(&p)
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
        std::fs::write(&p, "not json\n").unwrap();
        assert!(
            read_questions(&p)
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
        let g = unavailable(None, false, "no language model").unwrap();
        assert_eq!(g.status, Status::NotRun);
        assert!(g.message.starts_with("no language model"), "{}", g.message);
        assert_eq!(unavailable(None, true, "").unwrap().status, Status::Skipped);
    }
}
