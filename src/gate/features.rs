//! Where visual tokens come from: the exported artifact as executed, or the
//! fp32 reference tower on the source checkpoint. Both start from the image
//! file and each uses its own preprocessing (the manifest's, the
//! checkpoint's), as the cosine gate does.

use std::path::Path;
use std::time::Instant;

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::family::Model;
use crate::lm::ImageFeatures;
use crate::preprocess::{DecodeLimits, ImageProcessorConfig, preprocess_file};
use crate::reference::VisionTower;
use crate::runtime::Runtime;

/// Visual tokens of one image and how they were made.
pub struct Produced {
    pub features: ImageFeatures,
    /// The bucket that ran it, or `reference`.
    pub bucket: String,
    /// Seconds from the image file to the visual tokens.
    pub tower_s: f64,
}

/// What turns an image file into visual tokens for the language model: the
/// reference tower or an artifact (not to be confused with
/// [`crate::family::Tower`], what a family's config tells the pipeline).
pub trait VisualTokens {
    /// For reports: e.g. "artifact (mil-interpreter fp16)".
    fn describe(&self) -> String;
    fn features(&self, image: &Path) -> Result<Produced>;
}

/// The fp32 reference tower with the checkpoint's preprocessing.
pub struct ReferenceTower {
    tower: std::sync::Arc<dyn VisionTower>,
    pre: ImageProcessorConfig,
}

impl ReferenceTower {
    pub fn load(ck: &Model) -> Result<ReferenceTower> {
        Ok(ReferenceTower {
            tower: crate::family::reference_tower(ck)?,
            pre: ck.image_processor()?.clone(),
        })
    }
}

impl VisualTokens for ReferenceTower {
    fn describe(&self) -> String {
        "reference (fp32)".into()
    }
    fn features(&self, image: &Path) -> Result<Produced> {
        let t = Instant::now();
        let b = preprocess_file(image, &self.pre, DecodeLimits::default())?.batch;
        let pv = Tensor::from_slice(&b.pixel_values, (b.rows(), b.row_len), &Device::Cpu)?;
        let mut outputs = self.tower.forward(&pv, &b.grid_thw, false)?.outputs;
        if outputs.is_empty() {
            return Err(Error::Invalid("the reference tower gave no outputs".into()));
        }
        let embeds = outputs.remove(0);
        Ok(Produced {
            features: ImageFeatures {
                embeds,
                deepstack: outputs,
                grid_thw: b.grid_thw[0],
            },
            bucket: "reference".into(),
            tower_s: t.elapsed().as_secs_f64(),
        })
    }
}

/// An artifact as its executor runs it (the interpreter, or Core ML on a Mac).
pub struct ArtifactTower<'a>(pub &'a Runtime);

impl VisualTokens for ArtifactTower<'_> {
    fn describe(&self) -> String {
        format!("artifact ({})", self.0.executor().describe())
    }
    fn features(&self, image: &Path) -> Result<Produced> {
        let t = Instant::now();
        let e = self.0.embed_file(image)?;
        let bucket = e.bucket.clone();
        Ok(Produced {
            features: e.into_image_features()?,
            bucket,
            tower_s: t.elapsed().as_secs_f64(),
        })
    }
}
