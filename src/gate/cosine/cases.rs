//! The cosine gate's cases: the images each call runs, from a folder or
//! the default set (the golden natural images and the stress images).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What one call runs: images, or a text encoder's text.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    /// The images of the call (none for a text case).
    pub images: Vec<PathBuf>,
    /// The text of a text encoder's case.
    pub text: Option<String>,
}

/// The golden texts a text encoder's cosine gate uses by default
/// (`make golden-text`, python/golden/make_golden_text.py): plain English,
/// accents, CJK, emoji, mixed scripts, special tokens written in the text,
/// empty and whitespace-only texts, a medium one and a long one (longer
/// than 512 tokens for every golden tokenizer, so it fills every bucket).
pub const GOLDEN_TEXTS: &str = "golden/text/texts.jsonl";

/// A text encoder's cases: each text of `file` (UTF-8, one text per line,
/// named `line-<n>`; empty lines are texts too), else the golden texts
/// (JSON lines of `name` and `text`). Each case runs alone.
pub fn text_cases(file: Option<&Path>) -> Result<Vec<Case>> {
    let case = |name: String, text: String| Case {
        name,
        images: vec![],
        text: Some(text),
    };
    if let Some(f) = file {
        let s = std::fs::read_to_string(f).map_err(|e| Error::io(f, e))?;
        if s.is_empty() {
            return Err(Error::config(f, "no texts: expected one text per line"));
        }
        return Ok(s
            .lines()
            .enumerate()
            .map(|(i, l)| case(format!("line-{}", i + 1), l.to_string()))
            .collect());
    }
    let dir = crate::home::golden("golden/text", "--texts FILE")?;
    let path = dir.join("texts.jsonl");
    let s = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    s.lines()
        .enumerate()
        .map(|(i, l)| {
            let v: serde_json::Value = serde_json::from_str(l)
                .map_err(|e| Error::config(&path, format!("line {}: {e}", i + 1)))?;
            match (v["name"].as_str(), v["text"].as_str()) {
                (Some(n), Some(t)) => Ok(case(n.to_string(), t.to_string())),
                _ => Err(Error::config(
                    &path,
                    format!("line {}: expected {{\"name\", \"text\"}}", i + 1),
                )),
            }
        })
        .collect()
}

/// The natural images the gate uses by default, under `golden/images`:
/// small, large, square, wide, tall, extreme aspect, tiny (heavily padded
/// in any bucket), transparency, grayscale; then three of them in one call.
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

/// The stress images the gate also uses by default, under
/// `golden/images-stress` (python/golden/make_stress_images.py, whose
/// measurement is golden/README-stress.md): high-frequency content that
/// drives a tower's activations harder than natural images do, the pattern
/// that overflows trained Qwen towers in fp16 (a 56-px checkerboard broke
/// qwen2.5vl:3b, ollama PR #18070; llama.cpp #17534). Checkerboards with
/// fine (2 px), patch-sized (14 and 16 px, half a patch off the grid) and
/// coarse (56 px) cells, a page of small text and noise at 448 x 448 (no
/// Qwen processor resizes it; the `b1024` bucket), and one 1024 x 1024
/// checkerboard that fills the largest default bucket (64 x 64 patches at
/// patch 16 unresized, scaled to 896 x 896 at patch 14).
pub const STRESS_IMAGES: &[&str] = &[
    "checker2-448.png",
    "checker14-shift7-448.png",
    "checker16-shift8-448.png",
    "checker56-448.png",
    "text-448.png",
    "noise-448.png",
    "checker56-1024.png",
];

/// The gate's default cases, which `build` can calibrate on too: each
/// golden natural image alone, each stress image alone, then three natural
/// images in one call. Errors when the golden folders are not found (not
/// installed and not in a checkout), naming `--images DIR`.
pub fn default_cases() -> Result<Vec<Case>> {
    let natural = crate::home::golden("golden/images", "--images DIR")?;
    let stress = crate::home::golden("golden/images-stress", "--images DIR")?;
    let one = |root: &Path, n: &&str| Case {
        name: n.to_string(),
        images: vec![root.join(n)],
        text: None,
    };
    let mut out: Vec<Case> = GOLDEN_IMAGES.iter().map(|n| one(&natural, n)).collect();
    out.extend(STRESS_IMAGES.iter().map(|n| one(&stress, n)));
    out.push(Case {
        name: GOLDEN_MULTI.join("+"),
        images: GOLDEN_MULTI.iter().map(|n| natural.join(n)).collect(),
        text: None,
    });
    Ok(out)
}

/// The gate's cases: the default set, or every image in `dir` (sorted)
/// plus one call with its first three.
pub fn cases(dir: Option<&Path>) -> Result<Vec<Case>> {
    let Some(d) = dir else {
        return default_cases();
    };
    let names = folder_images(d)?;
    let mut out: Vec<Case> = names
        .iter()
        .map(|n| Case {
            name: n.clone(),
            images: vec![d.join(n)],
            text: None,
        })
        .collect();
    let multi: Vec<&String> = names.iter().take(3).collect();
    if multi.len() > 1 {
        out.push(Case {
            name: multi
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join("+"),
            images: multi.iter().map(|n| d.join(n)).collect(),
            text: None,
        });
    }
    Ok(out)
}

/// The names of the images in `dir` (.png, .jpg, .jpeg, .webp), sorted.
fn folder_images(d: &Path) -> Result<Vec<String>> {
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
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preprocess::{DecodeLimits, load_rgb, smart_resize};

    /// The default cases: each natural image, each stress image, then one
    /// call of three natural images; every file is there, and the stress
    /// folder holds exactly the listed images (what
    /// make_stress_images.py writes).
    #[test]
    fn default_cases_are_the_natural_and_stress_images() {
        let c = default_cases().unwrap();
        assert_eq!(c.len(), GOLDEN_IMAGES.len() + STRESS_IMAGES.len() + 1);
        for (case, name) in c.iter().zip(GOLDEN_IMAGES.iter().chain(STRESS_IMAGES)) {
            assert_eq!(&case.name, name);
            assert_eq!(case.images.len(), 1);
        }
        assert_eq!(c.last().unwrap().images.len(), 3);
        assert!(c.iter().flat_map(|c| &c.images).all(|p| p.is_file()));
        let stress = crate::home::golden("golden/images-stress", "").unwrap();
        let mut want: Vec<&str> = STRESS_IMAGES.to_vec();
        want.sort();
        assert_eq!(folder_images(&stress).unwrap(), want);
    }

    /// The stress images' sizes do what the doc comment says: the small
    /// ones are not resized at patch 16 or 14 and fit 1024 patches; the
    /// large one fills 4096 patches at patch 16 unresized and is scaled to
    /// 896 x 896, again 4096 patches, at patch 14.
    #[test]
    fn stress_image_sizes_fit_the_default_buckets() {
        let stress = crate::home::golden("golden/images-stress", "").unwrap();
        let mut large = 0;
        for n in STRESS_IMAGES {
            let img = load_rgb(&stress.join(n), DecodeLimits::default()).unwrap();
            let (w, h) = (img.width, img.height);
            for (patch, bucket) in [(16, 1024), (16, 4096), (14, 1024), (14, 4096)] {
                let cap = (bucket * patch * patch) as u64;
                let Ok((rh, rw)) = smart_resize(h, w, 2 * patch, 0, cap) else {
                    continue;
                };
                let patches = (rh / patch) * (rw / patch);
                if (w, h) == (448, 448) && bucket == 1024 {
                    assert_eq!((rw, rh), (448, 448), "{n} at patch {patch}");
                }
                if (w, h) == (1024, 1024) && bucket == 4096 {
                    large += 1;
                    assert_eq!(patches, 4096, "{n} at patch {patch}");
                    let side = if patch == 16 { 1024 } else { 896 };
                    assert_eq!((rw, rh), (side, side), "{n} at patch {patch}");
                }
            }
            assert!([(448, 448), (1024, 1024)].contains(&(w, h)), "{n}: {w}x{h}");
        }
        assert!(large >= 2, "no stress image fills the largest bucket");
    }
}
