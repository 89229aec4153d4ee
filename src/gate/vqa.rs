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
use super::features::VisualTokens;
use crate::error::{Error, Result};
use crate::lm::Vlm;

/// Where the gate looks for questions without `--vqa`.
pub const GOLDEN_QUESTIONS: &str = "golden/vqa/questions.jsonl";

/// Tokens generated per answer at most.
pub const MAX_ANSWER_TOKENS: usize = 16;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VqaThresholds {
    pub agreement_min: f64,
    pub accuracy_drop_max: f64,
    /// How far above always answering the most frequent expected answer the
    /// reference's accuracy must be for the questions to check anything
    /// ([`evaluate`]); reports written before it read as the default.
    #[serde(default = "default_margin")]
    pub informative_margin: f64,
}

fn default_margin() -> f64 {
    crate::buckets::Gates::default().vqa_informative_margin
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
    /// The most frequent expected answer and its share of the questions:
    /// the accuracy of always giving it, which the reference must beat by
    /// the informative margin ([`evaluate`]). Absent where nothing was
    /// answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub majority: Option<Majority>,
    pub questions: Vec<VqaRow>,
}

/// The most frequent expected answer (normalised) and its share.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Majority {
    pub answer: String,
    pub share: f64,
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

/// The most frequent expected answer of `rows` (normalised; ties to the
/// first in alphabetical order) and its share.
fn majority(rows: &[VqaRow]) -> Majority {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for r in rows {
        *counts.entry(norm(&r.expected)).or_default() += 1;
    }
    let (answer, n) =
        counts.into_iter().fold(
            (String::new(), 0),
            |best, (a, n)| if n > best.1 { (a, n) } else { best },
        );
    Majority {
        answer,
        share: n as f64 / rows.len().max(1) as f64,
    }
}

/// Judge answered questions against the thresholds.
///
/// The questions must first be informative: the reference's accuracy must
/// beat always giving the most frequent expected answer by
/// `th.informative_margin`. A language model that answers nothing right
/// agrees with itself whatever the tower sees, so agreement alone proves
/// nothing; such a gate is `not_run` (not informative), and the artifact
/// is not accepted.
pub fn evaluate(rows: Vec<VqaRow>, th: &VqaThresholds) -> VqaGate {
    if rows.is_empty() {
        return VqaGate {
            status: Status::Error,
            message: "no questions were answered".into(),
            agreement: None,
            accuracy_reference: None,
            accuracy_artifact: None,
            majority: None,
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
    let most = majority(&rows);
    if ar < most.share + th.informative_margin - 1e-12 {
        return VqaGate {
            status: Status::NotRun,
            message: format!(
                "not informative: the reference answers {:.1}% of the {} questions right, not {:.0} points \
                 above always answering \"{}\" ({:.1}%), so agreement ({:.1}%) shows nothing of the tower: \
                 the language model or the questions cannot judge it, and the artifact is not accepted",
                ar * 100.0,
                rows.len(),
                th.informative_margin * 100.0,
                most.answer,
                most.share * 100.0,
                agree * 100.0
            ),
            agreement: Some(agree),
            accuracy_reference: Some(ar),
            accuracy_artifact: Some(aa),
            majority: Some(most),
            questions: rows,
        };
    }
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
        majority: Some(most),
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
        majority: None,
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
        majority: None,
        questions: vec![],
    })
}

/// The question file: `--vqa FILE`, else the golden set of the tool's
/// home ([`crate::home`]).
pub fn question_file(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None => crate::home::golden(GOLDEN_QUESTIONS, "--vqa FILE").map_err(Error::from),
    }
}

/// Answer every question from both towers and judge the answers.
/// `progress` is told what runs. An image that cannot be read stops the gate.
pub fn run(
    questions: &[Question],
    vlm: &Vlm,
    reference: &dyn VisualTokens,
    artifact: &dyn VisualTokens,
    th: &VqaThresholds,
    progress: &dyn Fn(&str),
) -> Result<VqaGate> {
    let mut rows = Vec::with_capacity(questions.len());
    let started = std::time::Instant::now();
    let mut i = 0;
    while i < questions.len() {
        // questions about one image are answered from one run of each tower
        let img = &questions[i].image;
        let n = questions[i..]
            .iter()
            .take_while(|q| &q.image == img)
            .count();
        progress(&format!(
            "{} ({} of {} questions{})",
            img.display(),
            i + n,
            questions.len(),
            super::jobs::eta(started.elapsed(), i, questions.len())
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

    const ANSWERS: [&str; 5] = ["circle", "square", "triangle", "red", "blue"];

    fn th() -> VqaThresholds {
        VqaThresholds {
            agreement_min: 0.98,
            accuracy_drop_max: 0.01,
            informative_margin: 0.2,
        }
    }

    #[test]
    fn agreement_and_accuracy_drop() {
        let th = th();
        // Five answers in turn (the most frequent 20%); the reference is
        // right, the artifact wrong on the first `wrong`.
        let all = |n: usize, wrong: usize| -> Vec<VqaRow> {
            (0..n)
                .map(|i| {
                    let want = ANSWERS[i % 5];
                    let a = if i < wrong { "hexagon" } else { want };
                    row(&q(want), format!("{}.", want.to_uppercase()), a.into())
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
            g.message.contains("artifact says \"hexagon\""),
            "{}",
            g.message
        );
        // 1 of 100: agreement 99%, drop 1 point: pass.
        assert_eq!(evaluate(all(100, 1), &th).status, Status::Pass);
        assert_eq!(evaluate(vec![], &th).status, Status::Error);
    }

    /// Agreement proves nothing when the reference does no better than
    /// always giving the most frequent answer plus the margin.
    #[test]
    fn questions_the_reference_cannot_answer_are_not_informative() {
        let th = th();
        let rows = |reference: &dyn Fn(usize) -> String| -> Vec<VqaRow> {
            (0..100)
                .map(|i| {
                    // "yes" 40%, the rest 15% each.
                    let want = if i % 20 < 8 { "yes" } else { ANSWERS[i % 4] };
                    let r = reference(i);
                    row(&q(want), r.clone(), r)
                })
                .collect()
        };
        // Nothing right: 100% agreement, not informative.
        let g = evaluate(rows(&|_| "banana".into()), &th);
        assert_eq!(g.status, Status::NotRun);
        assert!(g.message.starts_with("not informative"), "{}", g.message);
        assert_eq!(g.agreement, Some(1.0));
        let m = g.majority.unwrap();
        assert_eq!((m.answer.as_str(), m.share), ("yes", 0.4));
        // Always "yes": 40% right, the majority's own share.
        assert_eq!(
            evaluate(rows(&|_| "yes".into()), &th).status,
            Status::NotRun
        );
        // Right on 60 of 100 (the majority's 40% + 20 points): informative.
        let g = evaluate(
            rows(&|i| {
                if i < 60 {
                    if i % 20 < 8 { "yes" } else { ANSWERS[i % 4] }.into()
                } else {
                    "banana".into()
                }
            }),
            &th,
        );
        assert_eq!(g.status, Status::Pass, "{}", g.message);
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
