//! The task gate: the third gate of a tower without a language model (an
//! encoder such as CLIP), in place of the VQA gate.
//!
//! A linear probe per labelled task (multinomial logistic regression,
//! [`Probe::fit`]) is fitted on the reference tower's pooled embeddings of
//! the labelled set's `train` images, then classifies its `test` images
//! twice: from the reference's embeddings and from the artifact's as
//! executed. Only the tasks the reference's probe has learned are gated:
//! its held-out accuracy must beat always answering the most frequent
//! class by `informative_margin` (a probe at chance sits on its decision
//! boundary for most images, where fp16 rounding flips its answer: that
//! says nothing of the artifact). Pass: on those tasks the two agree on at
//! least `agreement_min` of the (image, task) pairs, and on each the
//! artifact's accuracy is at most `accuracy_drop_max` below the
//! reference's ([`evaluate`]); with none, the gate is `not_run`. Nearest-neighbour
//! retrieval over the test images (cosine of the pooled embeddings) is
//! reported beside it, not gated: how often the artifact's nearest
//! neighbour of an image is the reference's (top-1), and how much of the
//! reference's five nearest the artifact's five keep (top-5).
//!
//! Label files are JSON lines: `{"image": "path", "split": "train"|"test",
//! "labels": {"task": "class", ...}}`, image paths relative to the file.
//! The default set is `golden/task/labels.jsonl` (written by `make
//! golden-task`): easy-vqa's synthetic shapes labelled with their shape (3
//! classes) and colour (8).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Status;
use crate::error::{Error, Result};

/// Where the gate looks for labelled images without `--task`.
pub const GOLDEN_LABELS: &str = "golden/task/labels.jsonl";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskThresholds {
    pub agreement_min: f64,
    pub accuracy_drop_max: f64,
    /// How far the reference's held-out accuracy must be above the most
    /// frequent class's share for a task to be gated.
    #[serde(default = "default_margin")]
    pub informative_margin: f64,
}

fn default_margin() -> f64 {
    crate::buckets::Gates::default().task_informative_margin
}

impl Default for TaskThresholds {
    fn default() -> Self {
        let g = crate::buckets::Gates::default();
        TaskThresholds {
            agreement_min: g.task_agreement_min,
            accuracy_drop_max: g.task_accuracy_drop_max,
            informative_margin: g.task_informative_margin,
        }
    }
}

/// Which part of the labelled set an image belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Test,
}

/// One labelled image, or a text encoder's labelled text.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Labelled {
    /// The image (resolved against the label file's folder); empty for a text.
    #[serde(default)]
    pub image: PathBuf,
    /// The text, for a text encoder's task gate.
    #[serde(default)]
    pub text: Option<String>,
    pub split: Split,
    pub labels: BTreeMap<String, String>,
}

impl Labelled {
    /// How reports name it: the image's path, or the text.
    pub fn describe(&self) -> String {
        match &self.text {
            Some(t) => t.clone(),
            None => self.image.display().to_string(),
        }
    }
}

/// A text encoder's labelled texts, used by default (`make golden-text`:
/// easy-vqa's distinct questions, labelled by the kind of answer they ask
/// for and the colour and shape they name).
pub const GOLDEN_TEXT_LABELS: &str = "golden/task-text/texts.jsonl";

/// One task's results over the test images.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskRow {
    pub task: String,
    pub classes: usize,
    pub accuracy_reference: f64,
    pub accuracy_artifact: f64,
    /// Test images whose two predictions agree, as a fraction.
    pub agreement: f64,
    /// The probe's accuracy on its own training images (reference side).
    pub train_accuracy: f64,
    /// The share of the held-out images in their most frequent class: what
    /// a probe that learned nothing scores.
    pub majority: f64,
    /// Whether the task is gated: the reference's accuracy beats `majority`
    /// by the threshold's margin.
    pub gated: bool,
}

/// One test image's predictions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskImage {
    pub image: String,
    pub bucket: String,
    pub expected: BTreeMap<String, String>,
    pub reference: BTreeMap<String, String>,
    pub artifact: BTreeMap<String, String>,
    pub agree: bool,
    /// Cosine of the two pooled embeddings of this image.
    pub cosine: f64,
}

/// Nearest-neighbour retrieval over the test images, reported, not gated.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Retrieval {
    pub queries: usize,
    /// Queries whose nearest neighbour (by the artifact's embeddings) is the reference's.
    pub top1_agreement: f64,
    /// Mean fraction of the reference's 5 nearest neighbours among the artifact's 5.
    pub top5_agreement: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskGate {
    pub status: Status,
    pub message: String,
    /// The output the probe reads (the family's pooled embedding).
    #[serde(default)]
    pub pooled: String,
    #[serde(default)]
    pub train_images: usize,
    #[serde(default)]
    pub test_images: usize,
    pub agreement: Option<f64>,
    #[serde(default)]
    pub tasks: Vec<TaskRow>,
    #[serde(default)]
    pub retrieval: Option<Retrieval>,
    #[serde(default)]
    pub images: Vec<TaskImage>,
}

impl TaskGate {
    /// The gate without numbers: `status` for `message`.
    pub fn without(status: Status, message: impl Into<String>) -> TaskGate {
        TaskGate {
            status,
            message: message.into(),
            pooled: String::new(),
            train_images: 0,
            test_images: 0,
            agreement: None,
            tasks: vec![],
            retrieval: None,
            images: vec![],
        }
    }
}

/// What a report written before the task gate existed holds for it.
impl Default for TaskGate {
    fn default() -> Self {
        TaskGate::without(
            Status::NotApplicable,
            "this report was written before the task gate existed",
        )
    }
}

/// Read a label file; errors name the file and line. It must hold train and
/// test images, every image the same tasks, and every task two classes or
/// more among the training images.
pub fn read_labels(path: &Path) -> Result<Vec<Labelled>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut out: Vec<Labelled> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut l: Labelled = serde_json::from_str(line).map_err(|e| {
            Error::config(
                path,
                format!(
                    "line {}: expected {{\"image\", \"split\": \"train\"|\"test\", \"labels\": {{...}}}}: {e}",
                    i + 1
                ),
            )
        })?;
        if l.labels.is_empty() || l.labels.values().any(|v| v.trim().is_empty()) {
            return Err(Error::config(
                path,
                format!("line {}: no labels, or an empty one", i + 1),
            ));
        }
        if let Some(first) = out.first()
            && first.labels.keys().ne(l.labels.keys())
        {
            return Err(Error::config(
                path,
                format!(
                    "line {}: tasks {:?}, but line 1 has {:?}: every image needs the same tasks",
                    i + 1,
                    l.labels.keys().collect::<Vec<_>>(),
                    first.labels.keys().collect::<Vec<_>>()
                ),
            ));
        }
        let has_image = !l.image.as_os_str().is_empty();
        if has_image == l.text.is_some() {
            return Err(Error::config(
                path,
                format!("line {}: expected exactly one of `image` and `text`", i + 1),
            ));
        }
        if let Some(first) = out.first()
            && first.text.is_some() != l.text.is_some()
        {
            return Err(Error::config(
                path,
                format!("line {}: images and texts mixed in one file", i + 1),
            ));
        }
        if has_image {
            l.image = base.join(&l.image);
        }
        out.push(l);
    }
    for split in [Split::Train, Split::Test] {
        if !out.iter().any(|l| l.split == split) {
            return Err(Error::config(
                path,
                format!("no {split:?} images: the probe needs both splits").to_lowercase(),
            ));
        }
    }
    for task in out[0].labels.keys() {
        let classes: std::collections::BTreeSet<&String> = out
            .iter()
            .filter(|l| l.split == Split::Train)
            .map(|l| &l.labels[task])
            .collect();
        if classes.len() < 2 {
            return Err(Error::config(
                path,
                format!(
                    "task `{task}`: the training images hold one class; a probe needs two or more"
                ),
            ));
        }
    }
    Ok(out)
}

/// The label file: `--task FILE`, else the golden set of the tool's home
/// ([`crate::home`]; the gate reports `not_run` before asking when neither
/// exists).
pub fn label_file(given: Option<&Path>, text: bool) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None if text => crate::home::golden(GOLDEN_TEXT_LABELS, "--task FILE").map_err(Error::from),
        None => crate::home::golden(GOLDEN_LABELS, "--task FILE").map_err(Error::from),
    }
}

/// A linear classifier over standardised features: `argmax(W z + b)` with
/// `z = (x - mean) / std`.
#[derive(Clone, Debug)]
pub struct Probe {
    mean: Vec<f64>,
    inv_std: Vec<f64>,
    /// `[classes, dim]`.
    w: Vec<f64>,
    b: Vec<f64>,
    classes: usize,
}

/// L2 penalty of the probe's weights.
const L2: f64 = 1e-3;
/// Gradient steps of the fit (full batch).
const STEPS: usize = 500;
/// Step size of the fit.
const LEARNING_RATE: f64 = 0.5;

impl Probe {
    /// Fit multinomial logistic regression with an L2 penalty by full-batch
    /// gradient descent (deterministic: zero start, fixed steps) on `x`
    /// (rows of `dim` features) and labels `y` in `0..classes`.
    pub fn fit(x: &[Vec<f32>], y: &[usize], classes: usize) -> Probe {
        let n = x.len();
        let dim = x.first().map_or(0, Vec::len);
        let mut mean = vec![0f64; dim];
        for r in x {
            for (m, v) in mean.iter_mut().zip(r) {
                *m += *v as f64 / n as f64;
            }
        }
        let mut var = vec![0f64; dim];
        for r in x {
            for ((s, v), m) in var.iter_mut().zip(r).zip(&mean) {
                *s += (*v as f64 - m).powi(2) / n as f64;
            }
        }
        let inv_std: Vec<f64> = var
            .iter()
            .map(|v| if *v > 1e-24 { 1.0 / v.sqrt() } else { 0.0 })
            .collect();
        let mut p = Probe {
            mean,
            inv_std,
            w: vec![0.0; classes * dim],
            b: vec![0.0; classes],
            classes,
        };
        let z: Vec<Vec<f64>> = x.iter().map(|r| p.standardise(r)).collect();
        let mut gw = vec![0f64; classes * dim];
        let mut gb = vec![0f64; classes];
        for _ in 0..STEPS {
            gw.iter_mut().for_each(|g| *g = 0.0);
            gb.iter_mut().for_each(|g| *g = 0.0);
            for (zi, &yi) in z.iter().zip(y) {
                let prob = p.probabilities(zi);
                for c in 0..classes {
                    let e = prob[c] - if c == yi { 1.0 } else { 0.0 };
                    gb[c] += e / n as f64;
                    for (g, v) in gw[c * dim..(c + 1) * dim].iter_mut().zip(zi) {
                        *g += e * v / n as f64;
                    }
                }
            }
            for (w, g) in p.w.iter_mut().zip(&gw) {
                *w -= LEARNING_RATE * (g + L2 * *w);
            }
            for (b, g) in p.b.iter_mut().zip(&gb) {
                *b -= LEARNING_RATE * g;
            }
        }
        p
    }

    fn standardise(&self, x: &[f32]) -> Vec<f64> {
        x.iter()
            .zip(&self.mean)
            .zip(&self.inv_std)
            .map(|((v, m), s)| (*v as f64 - m) * s)
            .collect()
    }

    fn probabilities(&self, z: &[f64]) -> Vec<f64> {
        let dim = z.len();
        let logits: Vec<f64> = (0..self.classes)
            .map(|c| {
                self.b[c]
                    + self.w[c * dim..(c + 1) * dim]
                        .iter()
                        .zip(z)
                        .map(|(w, v)| w * v)
                        .sum::<f64>()
            })
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    /// The class of one feature row (the lowest index among equal scores).
    pub fn predict(&self, x: &[f32]) -> usize {
        let p = self.probabilities(&self.standardise(x));
        let mut best = 0;
        for (c, v) in p.iter().enumerate() {
            if *v > p[best] {
                best = c;
            }
        }
        best
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na * nb)
}

/// The other rows of `e` in order of decreasing cosine to row `q` (ties by index).
fn neighbours(e: &[Vec<f32>], q: usize) -> Vec<usize> {
    let mut v: Vec<(usize, f64)> = (0..e.len())
        .filter(|&j| j != q)
        .map(|j| (j, cosine(&e[q], &e[j])))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().map(|(j, _)| j).collect()
}

/// Nearest-neighbour agreement of the artifact's test embeddings with the reference's.
pub fn retrieval(reference: &[Vec<f32>], artifact: &[Vec<f32>]) -> Option<Retrieval> {
    let n = reference.len();
    if n < 2 || artifact.len() != n {
        return None;
    }
    let (mut top1, mut top5) = (0usize, 0f64);
    for q in 0..n {
        let (r, a) = (neighbours(reference, q), neighbours(artifact, q));
        top1 += usize::from(r[0] == a[0]);
        let k = 5.min(n - 1);
        top5 += r[..k].iter().filter(|j| a[..k].contains(j)).count() as f64 / k as f64;
    }
    Some(Retrieval {
        queries: n,
        top1_agreement: top1 as f64 / n as f64,
        top5_agreement: top5 / n as f64,
    })
}

/// The pooled embeddings of one image from both sides.
pub struct Pooled {
    pub reference: Vec<f32>,
    pub artifact: Vec<f32>,
    /// The bucket that ran the image on the artifact side.
    pub bucket: String,
}

/// Fit the probes on `train` (the reference's embeddings of the training
/// images, with their labels), classify the test images from both sides
/// and judge the result against `th`.
pub fn evaluate(
    labelled: &[Labelled],
    train: &[Vec<f32>],
    test: &[Pooled],
    pooled: &str,
    th: &TaskThresholds,
) -> TaskGate {
    let train_l: Vec<&Labelled> = labelled
        .iter()
        .filter(|l| l.split == Split::Train)
        .collect();
    let test_l: Vec<&Labelled> = labelled.iter().filter(|l| l.split == Split::Test).collect();
    assert_eq!(
        train_l.len(),
        train.len(),
        "one embedding per training image"
    );
    assert_eq!(
        test_l.len(),
        test.len(),
        "one pair of embeddings per test image"
    );
    let tasks: Vec<String> = train_l[0].labels.keys().cloned().collect();
    let mut rows = Vec::new();
    let mut images: Vec<TaskImage> = test_l
        .iter()
        .zip(test)
        .map(|(l, p)| TaskImage {
            image: l.describe(),
            bucket: p.bucket.clone(),
            expected: l.labels.clone(),
            reference: BTreeMap::new(),
            artifact: BTreeMap::new(),
            agree: true,
            cosine: cosine(&p.reference, &p.artifact),
        })
        .collect();
    let (mut pairs, mut agreeing) = (0usize, 0usize);
    for task in &tasks {
        // Classes in sorted order, from the training labels.
        let classes: Vec<String> = train_l
            .iter()
            .map(|l| l.labels[task].clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let index = |s: &str| classes.iter().position(|c| c == s);
        let y: Vec<usize> = train_l
            .iter()
            .map(|l| index(&l.labels[task]).expect("a training class"))
            .collect();
        let probe = Probe::fit(train, &y, classes.len());
        let train_ok = train
            .iter()
            .zip(&y)
            .filter(|(x, y)| probe.predict(x) == **y)
            .count();
        let (mut ok_r, mut ok_a, mut same) = (0usize, 0usize, 0usize);
        let mut alike = Vec::with_capacity(test.len());
        for ((l, p), img) in test_l.iter().zip(test).zip(images.iter_mut()) {
            let (r, a) = (
                &classes[probe.predict(&p.reference)],
                &classes[probe.predict(&p.artifact)],
            );
            ok_r += usize::from(*r == l.labels[task]);
            ok_a += usize::from(*a == l.labels[task]);
            same += usize::from(r == a);
            alike.push(r == a);
            img.reference.insert(task.clone(), r.clone());
            img.artifact.insert(task.clone(), a.clone());
        }
        let n = test.len() as f64;
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for l in &test_l {
            *counts.entry(l.labels[task].as_str()).or_default() += 1;
        }
        let majority = counts.values().copied().max().unwrap_or(0) as f64 / n;
        let accuracy_reference = ok_r as f64 / n;
        let gated = accuracy_reference >= majority + th.informative_margin - 1e-12;
        // A task not gated counts in no image's agreement either.
        if gated {
            pairs += test.len();
            agreeing += same;
            for (img, a) in images.iter_mut().zip(&alike) {
                img.agree &= a;
            }
        }
        rows.push(TaskRow {
            task: task.clone(),
            classes: classes.len(),
            accuracy_reference,
            accuracy_artifact: ok_a as f64 / n,
            agreement: same as f64 / n,
            train_accuracy: train_ok as f64 / train.len() as f64,
            majority,
            gated,
        });
    }
    let describe = |r: &TaskRow| {
        format!(
            "{} accuracy {:.1}% from the artifact vs {:.1}% from the reference (majority class {:.1}%){}",
            r.task,
            r.accuracy_artifact * 100.0,
            r.accuracy_reference * 100.0,
            r.majority * 100.0,
            if r.gated { "" } else { ", not gated" }
        )
    };
    let reference: Vec<Vec<f32>> = test.iter().map(|p| p.reference.clone()).collect();
    let artifact: Vec<Vec<f32>> = test.iter().map(|p| p.artifact.clone()).collect();
    if pairs == 0 {
        return TaskGate {
            message: format!(
                "no task's probe beats its majority class by {:.0} points on the reference's embeddings, so \
                 the labels check nothing of this tower: {}",
                th.informative_margin * 100.0,
                rows.iter().map(describe).collect::<Vec<_>>().join(", ")
            ),
            pooled: pooled.to_string(),
            train_images: train.len(),
            test_images: test.len(),
            tasks: rows,
            retrieval: retrieval(&reference, &artifact),
            ..TaskGate::without(Status::NotRun, "")
        };
    }
    let agreement = agreeing as f64 / pairs as f64;
    let worst_drop = rows
        .iter()
        .filter(|r| r.gated)
        .map(|r| r.accuracy_reference - r.accuracy_artifact)
        .fold(f64::NEG_INFINITY, f64::max);
    let pass = agreement >= th.agreement_min && worst_drop <= th.accuracy_drop_max + 1e-12;
    let gated = rows.iter().filter(|r| r.gated).count();
    let mut message = format!(
        "agreement {:.1}% (min {:.1}%) over {} test {} x {} gated task{}; {}",
        agreement * 100.0,
        th.agreement_min * 100.0,
        test.len(),
        if labelled.iter().any(|l| l.text.is_some()) {
            "texts"
        } else {
            "images"
        },
        gated,
        if gated == 1 { "" } else { "s" },
        rows.iter().map(describe).collect::<Vec<_>>().join(", ")
    );
    message.push_str(&format!(
        " (max drop {:.1} points)",
        th.accuracy_drop_max * 100.0
    ));
    if let Some(img) = images.iter().find(|i| !i.agree) {
        message.push_str(&format!(
            "; e.g. {}: artifact says {:?}, reference {:?}",
            img.image, img.artifact, img.reference
        ));
    }
    TaskGate {
        status: if pass { Status::Pass } else { Status::Fail },
        message,
        pooled: pooled.to_string(),
        train_images: train.len(),
        test_images: test.len(),
        agreement: Some(agreement),
        tasks: rows,
        retrieval: retrieval(&reference, &artifact),
        images,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two clusters per task, the classes apart along a different axis each.
    fn data(n: usize, seed: u64) -> (Vec<Vec<f32>>, Vec<usize>, Vec<usize>) {
        let mut s = seed;
        let mut rnd = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64) as f32 - 0.5
        };
        let (mut x, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let (ya, yb) = (i % 3, (i / 3) % 2);
            let mut r: Vec<f32> = (0..6).map(|_| rnd() * 0.3).collect();
            r[0] += ya as f32;
            r[3] += 2.0 * yb as f32;
            x.push(r);
            a.push(ya);
            b.push(yb);
        }
        (x, a, b)
    }

    #[test]
    fn the_probe_separates_separable_classes() {
        let (x, a, b) = data(120, 1);
        let (tx, ta, tb) = data(60, 2);
        let pa = Probe::fit(&x, &a, 3);
        let pb = Probe::fit(&x, &b, 2);
        let acc = |p: &Probe, y: &[usize]| {
            tx.iter()
                .zip(y)
                .filter(|(x, y)| p.predict(x) == **y)
                .count() as f64
                / tx.len() as f64
        };
        assert!(acc(&pa, &ta) >= 0.95, "{}", acc(&pa, &ta));
        assert!(acc(&pb, &tb) >= 0.95, "{}", acc(&pb, &tb));
        // Deterministic.
        let again = Probe::fit(&x, &a, 3);
        assert!(tx.iter().all(|r| pa.predict(r) == again.predict(r)));
    }

    #[test]
    fn retrieval_agrees_with_itself_and_not_with_noise() {
        let (x, _, _) = data(30, 3);
        let r = retrieval(&x, &x).unwrap();
        assert_eq!((r.top1_agreement, r.top5_agreement), (1.0, 1.0));
        let (y, _, _) = data(30, 4);
        let r = retrieval(&x, &y).unwrap();
        assert!(r.top1_agreement < 0.8, "{}", r.top1_agreement);
    }

    fn labelled(split: Split, a: usize, b: usize) -> Labelled {
        Labelled {
            image: PathBuf::from("i.png"),
            text: None,
            split,
            labels: [
                ("a".to_string(), format!("a{a}")),
                ("b".to_string(), format!("b{b}")),
            ]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn evaluate_fails_an_artifact_whose_embeddings_disagree() {
        let (x, a, b) = data(120, 5);
        let (tx, ta, tb) = data(60, 6);
        let mut l: Vec<Labelled> = a
            .iter()
            .zip(&b)
            .map(|(a, b)| labelled(Split::Train, *a, *b))
            .collect();
        l.extend(
            ta.iter()
                .zip(&tb)
                .map(|(a, b)| labelled(Split::Test, *a, *b)),
        );
        let th = TaskThresholds::default();
        let same: Vec<Pooled> = tx
            .iter()
            .map(|r| Pooled {
                reference: r.clone(),
                artifact: r.clone(),
                bucket: "b".into(),
            })
            .collect();
        let g = evaluate(&l, &x, &same, "pooled", &th);
        assert_eq!(g.status, Status::Pass, "{}", g.message);
        assert_eq!(g.agreement, Some(1.0));
        assert_eq!(g.tasks.len(), 2);
        // The artifact's embeddings with the first feature negated: task `a` flips.
        let broken: Vec<Pooled> = tx
            .iter()
            .map(|r| {
                let mut a = r.clone();
                a[0] = 2.0 - a[0];
                Pooled {
                    reference: r.clone(),
                    artifact: a,
                    bucket: "b".into(),
                }
            })
            .collect();
        let g = evaluate(&l, &x, &broken, "pooled", &th);
        assert_eq!(g.status, Status::Fail, "{}", g.message);
        assert!(g.agreement.unwrap() < th.agreement_min);
        assert!(g.images.iter().any(|i| !i.agree));
    }

    #[test]
    fn a_task_at_chance_is_reported_and_not_gated() {
        let (x, a, _) = data(120, 7);
        let (tx, ta, _) = data(60, 8);
        // Task `a` is learnable; task `b` is noise (labels unrelated to the features).
        let noise = |i: usize| (i * 7 + i / 5) % 2;
        let mut l: Vec<Labelled> = a
            .iter()
            .enumerate()
            .map(|(i, a)| labelled(Split::Train, *a, noise(i)))
            .collect();
        l.extend(
            ta.iter()
                .enumerate()
                .map(|(i, a)| labelled(Split::Test, *a, noise(i + 1000))),
        );
        // The artifact's embeddings: tiny noise that flips answers near a boundary.
        let test: Vec<Pooled> = tx
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut a = r.clone();
                a[5] += if i % 2 == 0 { 1e-3 } else { -1e-3 };
                Pooled {
                    reference: r.clone(),
                    artifact: a,
                    bucket: "b".into(),
                }
            })
            .collect();
        let th = TaskThresholds::default();
        let g = evaluate(&l, &x, &test, "pooled", &th);
        let row = |t: &str| g.tasks.iter().find(|r| r.task == t).unwrap().clone();
        assert!(row("a").gated, "{:?}", row("a"));
        assert!(!row("b").gated, "{:?}", row("b"));
        assert!(g.message.contains("not gated"), "{}", g.message);
        assert_eq!(g.status, Status::Pass, "{}", g.message);
        // With only the noise task, the gate cannot judge: not_run.
        let only_b: Vec<Labelled> = l
            .iter()
            .map(|x| Labelled {
                labels: [("b".to_string(), x.labels["b"].clone())]
                    .into_iter()
                    .collect(),
                ..x.clone()
            })
            .collect();
        let g = evaluate(&only_b, &x, &test, "pooled", &th);
        assert_eq!(g.status, Status::NotRun, "{}", g.message);
        assert!(g.message.contains("majority class"), "{}", g.message);
    }
}
