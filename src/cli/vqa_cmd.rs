//! `ane-run vqa`: answer a question about an image with an artifact's visual
//! tokens (or the reference tower's) and the checkpoint's language model.

use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;

use super::{VqaArgs, VqaTower};
use crate::artifact::Artifact;
use crate::checkpoint::resolve_model;
use crate::error::Error;
use crate::family;
use crate::family::Model;
use crate::gate::features::{ArtifactTower, ReferenceTower, VisualTokens};
use crate::lm::Vlm;

pub(super) fn run(a: VqaArgs, interp: crate::interp::Settings) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    if a.max_tokens == 0 {
        return Err(Error::Invalid("--max-tokens must be at least 1".into()).into());
    }
    let art = Artifact::open(&a.artifact)?;
    let dir = match &a.model {
        Some(m) => resolve_model(m, None, &super::hub_events())?,
        None => art.source_dir()?,
    };
    let vlm = Vlm::load(&dir, family::decoder)?;
    // Check the question before running the tower.
    vlm.prompt(1, &a.question)?;
    let load_s = t0.elapsed().as_secs_f64();

    let produced = match a.tower {
        VqaTower::Artifact => {
            let rt = super::embed_cmd::open_runtime(
                &a.artifact,
                a.executor,
                &a.coreml,
                super::mil(a.precision, interp),
                a.allow_unaccepted,
            )?;
            let t = ArtifactTower(&rt);
            (t.features(&a.image)?, t.describe())
        }
        VqaTower::Reference => {
            let ck = Model::open(&dir)?;
            let t = ReferenceTower::load(&ck)?;
            if let Some(w) = ck.weights.nonfinite_warning() {
                eprintln!("warning: {w}");
            }
            (t.features(&a.image)?, t.describe())
        }
    };
    let (p, tower) = produced;
    let ans = vlm.answer(&p.features, &a.question, a.max_tokens)?;
    if a.json {
        let out = json!({
            "image": a.image.display().to_string(),
            "question": a.question,
            "answer": ans.text,
            "tokens": ans.tokens,
            "prompt_tokens": ans.prompt_tokens,
            "visual_tokens": p.features.embeds.dims2()?.0,
            "grid_thw": p.features.grid_thw,
            "stop": ans.stop,
            "tower": tower,
            "bucket": p.bucket,
            "model": dir.display().to_string(),
            "timings_s": {
                "load": load_s,
                "tower": p.tower_s,
                "prefill": ans.prefill_s,
                "decode": ans.decode_s,
                "total": t0.elapsed().as_secs_f64(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{}", ans.text);
    }
    Ok(ExitCode::SUCCESS)
}
