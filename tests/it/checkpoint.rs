//! Checkpoint layouts a real model can come in: sharded safetensors with an
//! index, the `visual.` prefix of Qwen2/2.5-VL checkpoints, and a repo id in
//! the offline Hugging Face cache at a revision. Each must give the same
//! outputs as the plain golden directory.

use std::path::Path;

use safetensors::tensor::TensorView;

use crate::common::{copy_model, golden, read_all, run};

/// Every tensor of a safetensors file as (name, dtype, shape, bytes).
fn tensors(path: &Path) -> Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn write(path: &Path, ts: &[(String, safetensors::Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = ts
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Run the reference on one golden image and return its embeddings.
fn embeds(model: &str, extra_env: &[(&str, &Path)], revision: Option<&str>) -> Vec<f32> {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o.safetensors");
    let img = golden("images/tall.png");
    let mut args = vec![
        "reference",
        "--model",
        model,
        "--image",
        img.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    if let Some(r) = revision {
        args.extend(["--revision", r]);
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ane-export"))
        .args(&args)
        .envs(extra_env.iter().map(|(k, v)| (*k, *v)))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_all(&out).0.remove("embeds").unwrap().f32
}

#[test]
fn sharded_checkpoint_matches_single_file() {
    let plain = embeds(golden("models/tiny-b").to_str().unwrap(), &[], None);
    let m = copy_model("tiny-b");
    let single = m.path().join("model.safetensors");
    let all = tensors(&single);
    std::fs::remove_file(&single).unwrap();
    let (a, b) = all.split_at(all.len() / 2);
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write(&m.path().join(names[0]), a);
    write(&m.path().join(names[1]), b);
    let mut map = serde_json::Map::new();
    for (part, file) in [(a, names[0]), (b, names[1])] {
        for t in part {
            map.insert(t.0.clone(), file.into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        m.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    assert_eq!(embeds(m.path().to_str().unwrap(), &[], None), plain);

    // An index that names a missing shard is an error naming it.
    std::fs::remove_file(m.path().join(names[1])).unwrap();
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            m.path().to_str().unwrap(),
            "--image",
            "x.png",
            "--out",
            "o.safetensors",
        ],
    );
    crate::common::assert_fails(&o, &[names[1], "missing"]);
}

#[test]
fn qwen2_style_visual_prefix_is_found() {
    let plain = embeds(golden("models/tiny-a").to_str().unwrap(), &[], None);
    let m = copy_model("tiny-a");
    let p = m.path().join("model.safetensors");
    let renamed: Vec<_> = tensors(&p)
        .into_iter()
        .map(|(n, d, s, b)| {
            (
                n.strip_prefix("model.")
                    .map_or(n.clone(), |r| r.to_string()),
                d,
                s,
                b,
            )
        })
        .collect();
    assert!(
        renamed
            .iter()
            .any(|t| t.0 == "visual.patch_embed.proj.weight")
    );
    write(&p, &renamed);
    assert_eq!(embeds(m.path().to_str().unwrap(), &[], None), plain);
}

#[test]
fn repo_id_resolves_in_offline_cache_at_revision() {
    let plain = embeds(golden("models/tiny-c").to_str().unwrap(), &[], None);
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--tiny--qwen3-vl-c");
    let commit = "1111111111111111111111111111111111111111";
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    // Files are symlinks into blobs/, as huggingface_hub lays them out.
    for e in std::fs::read_dir(golden("models/tiny-c")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_owned();
        let blob = repo.join("blobs").join(&name);
        std::fs::copy(&p, &blob).unwrap();
        std::os::unix::fs::symlink(Path::new("../../blobs").join(&name), snap.join(&name)).unwrap();
    }
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    std::fs::write(repo.join("refs/v1"), commit).unwrap();
    // Offline: the cache alone (a download is tests/it/hub.rs's business).
    let env = [
        ("HF_HUB_CACHE", cache.path()),
        ("HF_HUB_OFFLINE", Path::new("1")),
    ];
    assert_eq!(embeds("tiny/qwen3-vl-c", &env, None), plain);
    assert_eq!(embeds("tiny/qwen3-vl-c", &env, Some("v1")), plain);
    assert_eq!(embeds("tiny/qwen3-vl-c", &env, Some(commit)), plain);
    // HF_HOME/hub is the fallback when HF_HUB_CACHE is unset.
    let home = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(cache.path(), home.path().join("hub")).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ane-export"))
        .args([
            "reference",
            "--model",
            "tiny/qwen3-vl-c",
            "--revision",
            "v9",
            "--image",
            "x.png",
            "--out",
            "o.safetensors",
        ])
        .env_remove("HF_HUB_CACHE")
        .env("HF_HOME", home.path())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    crate::common::assert_fails(&o, &["revision `v9`", "not in the cache"]);
}
