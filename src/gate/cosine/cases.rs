//! The cosine gate's cases: the images each call runs, from a folder or
//! the golden set.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Images run in one call.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub images: Vec<PathBuf>,
}

/// The images the gate uses by default, under `golden/images`: small,
/// large, square, wide, tall, extreme aspect, tiny (heavily padded in any
/// bucket), transparency, grayscale; then three of them in one call.
pub const GOLDEN_IMAGES: &[&str] = &[
    "square.png",
    "wide.jpg",
    "tall.png",
    "tiny.png",
    "large.jpg",
    "extreme.png",
    "rgba.png",
    "gray.jpg",
];
const GOLDEN_MULTI: &[&str] = &["square.png", "rgba.png", "tiny.png"];

/// The gate's cases: the golden set, or every image in `dir` (sorted) plus
/// one call with its first three.
pub fn cases(dir: Option<&Path>) -> Result<Vec<Case>> {
    let (root, names): (PathBuf, Vec<String>) = match dir {
        None => {
            let root = crate::home::golden("golden/images", "--images DIR")?;
            (root, GOLDEN_IMAGES.iter().map(|s| s.to_string()).collect())
        }
        Some(d) => {
            let mut v = Vec::new();
            for e in std::fs::read_dir(d).map_err(|e| Error::io(d, e))? {
                let p = e.map_err(|e| Error::io(d, e))?.path();
                let ext = p
                    .extension()
                    .map(|x| x.to_string_lossy().to_lowercase())
                    .unwrap_or_default();
                if p.is_file() && ["png", "jpg", "jpeg", "webp"].contains(&ext.as_str()) {
                    v.push(
                        p.file_name()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .to_string(),
                    );
                }
            }
            v.sort();
            if v.is_empty() {
                return Err(Error::checkpoint(d, "no .png, .jpg, .jpeg or .webp images"));
            }
            (d.to_path_buf(), v)
        }
    };
    let mut out: Vec<Case> = names
        .iter()
        .map(|n| Case {
            name: n.clone(),
            images: vec![root.join(n)],
        })
        .collect();
    let multi: Vec<String> = if dir.is_none() {
        GOLDEN_MULTI.iter().map(|s| s.to_string()).collect()
    } else {
        names.iter().take(3).cloned().collect()
    };
    if multi.len() > 1 {
        out.push(Case {
            name: multi.join("+"),
            images: multi.iter().map(|n| root.join(n)).collect(),
        });
    }
    Ok(out)
}
