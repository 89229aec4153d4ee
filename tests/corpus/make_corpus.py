#!/usr/bin/env python3
"""Write the bad-input corpus under tests/corpus/ (deterministic; numpy and coremltools' protobuf classes).

    .venv/bin/python tests/corpus/make_corpus.py

Each case is a directory holding its bad input(s); `cases.json` (written by
hand, not by this script) says for each case which command runs on it, the
exit code it must end with and the words its error must contain. The
checkpoint cases start from a micro Qwen3-VL checkpoint (hidden size 8, one
block, fp16) made here, so the corpus stays small.
"""

import json
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
GOLDEN = ROOT.parent.parent / "golden"

VISION = {
    "deepstack_visual_indexes": [0], "depth": 1, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 8,
    "in_channels": 3, "intermediate_size": 8, "model_type": "qwen3_vl_vision", "num_heads": 2,
    "num_position_embeddings": 16, "out_hidden_size": 8, "patch_size": 16, "spatial_merge_size": 2,
    "temporal_patch_size": 2, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"},
}
CONFIG = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
          "vision_config": VISION, "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 8}}


def shapes():
    d, i, o, m = 8, 8, 8, 4 * 8
    s = {"patch_embed.proj.weight": [d, 3, 2, 16, 16], "patch_embed.proj.bias": [d],
         "pos_embed.weight": [16, d]}
    b = "blocks.0."
    for n in ("norm1", "norm2"):
        s[b + n + ".weight"] = [d]
        s[b + n + ".bias"] = [d]
    s[b + "attn.qkv.weight"], s[b + "attn.qkv.bias"] = [3 * d, d], [3 * d]
    s[b + "attn.proj.weight"], s[b + "attn.proj.bias"] = [d, d], [d]
    s[b + "mlp.linear_fc1.weight"], s[b + "mlp.linear_fc1.bias"] = [i, d], [i]
    s[b + "mlp.linear_fc2.weight"], s[b + "mlp.linear_fc2.bias"] = [d, i], [d]
    for p, norm in (("merger.", d), ("deepstack_merger_list.0.", m)):
        s[p + "norm.weight"], s[p + "norm.bias"] = [norm], [norm]
        s[p + "linear_fc1.weight"], s[p + "linear_fc1.bias"] = [m, m], [m]
        s[p + "linear_fc2.weight"], s[p + "linear_fc2.bias"] = [o, m], [o]
    return {"model.visual." + k: v for k, v in s.items()}


def safetensors(tensors, dtypes=None):
    """Bytes of a safetensors file; `dtypes` overrides the declared dtype per name."""
    header, body, off = {}, b"", 0
    for name in sorted(tensors):
        a = tensors[name]
        raw = a.tobytes()
        dt = (dtypes or {}).get(name, {"float16": "F16", "float32": "F32", "int32": "I32"}[str(a.dtype)])
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        body += raw
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + body


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return {k: (0.02 * rng.standard_normal(v)).astype(np.float16) for k, v in shapes().items()}


def model_dir(name, files):
    d = ROOT / name / "model"
    d.mkdir(parents=True)
    for fname, data in files.items():
        (d / fname).write_bytes(data if isinstance(data, bytes) else data.encode())


def png(w, h, chunks_only=False):
    """A PNG with an IHDR claiming w x h; pixel data only when small."""
    def chunk(t, data):
        return struct.pack(">I", len(data)) + t + data + struct.pack(">I", zlib.crc32(t + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    if chunks_only:
        out += chunk(b"IDAT", zlib.compress(b""))  # the decoder stops at the first IDAT for the header
    else:
        raw = b"".join(b"\x00" + bytes([128, 64, 32]) * w for _ in range(h))
        out += chunk(b"IDAT", zlib.compress(raw))
    return out + chunk(b"IEND", b"")


def main():
    for d in ROOT.iterdir():
        if d.is_dir():
            shutil.rmtree(d)
    cfg = json.dumps(CONFIG, indent=1)
    w = weights()
    good = safetensors(w)

    # Checkpoints.
    model_dir("ckpt-ok", {"config.json": cfg, "model.safetensors": good})
    model_dir("ckpt-truncated", {"config.json": cfg, "model.safetensors": good[: len(good) // 2]})
    n = struct.unpack("<Q", good[:8])[0]
    h = json.loads(good[8:8 + n])
    k = "model.visual.pos_embed.weight"
    a, b = h[k]["data_offsets"]
    h[k]["data_offsets"] = [a, b + 10_000]
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    model_dir("ckpt-lying-offsets", {"config.json": cfg,
                                     "model.safetensors": struct.pack("<Q", len(hb)) + hb + good[8 + n:]})
    model_dir("ckpt-huge-header", {"config.json": cfg,
                                   "model.safetensors": struct.pack("<Q", 1 << 40) + good[8:64]})
    nan = dict(w)
    bad = nan["model.visual.blocks.0.attn.qkv.weight"].copy()
    bad[3, 1] = np.nan
    nan["model.visual.blocks.0.attn.qkv.weight"] = bad
    model_dir("ckpt-nan-weights", {"config.json": cfg, "model.safetensors": safetensors(nan)})
    big = dict(w)
    huge = big["model.visual.blocks.0.mlp.linear_fc2.weight"].astype(np.float32)
    huge[2, 5] = 1e5
    big["model.visual.blocks.0.mlp.linear_fc2.weight"] = huge
    model_dir("ckpt-beyond-fp16", {"config.json": cfg, "model.safetensors": safetensors(big)})
    ints = dict(w)
    ints["model.visual.pos_embed.weight"] = np.zeros((16, 8), np.int32)
    model_dir("ckpt-int-dtype", {"config.json": cfg, "model.safetensors": safetensors(ints)})
    model_dir("ckpt-pickle", {"config.json": cfg, "pytorch_model.bin": b"\x80\x04\x95 not loaded"})
    wide = json.loads(cfg)
    wide["vision_config"]["intermediate_size"] = 16
    model_dir("ckpt-config-disagrees", {"config.json": json.dumps(wide), "model.safetensors": good})
    nofield = json.loads(cfg)
    del nofield["vision_config"]["num_heads"]
    model_dir("ckpt-config-missing-field", {"config.json": json.dumps(nofield), "model.safetensors": good})
    model_dir("ckpt-config-not-json", {"config.json": "{\"model_type\": \"qwen3_vl\",", "model.safetensors": good})
    model_dir("ckpt-no-weights", {"config.json": cfg})

    # Images (run through ane-run preprocess against tiny-a).
    imgs = {
        "img-truncated-jpeg": ("img.jpg", (GOLDEN / "images/wide.jpg").read_bytes()[:400]),
        "img-zero-size": ("img.png", b""),
        "img-enormous": ("img.png", png(200_000, 200_000, chunks_only=True)),
        "img-text-as-png": ("img.png", b"this is not an image\n"),
        "img-gif": ("img.gif", b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x01\x00\x00\x00"
                    b"\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"),
        "img-extreme-aspect": ("img.png", png(300, 1)),
    }
    for name, (fname, data) in imgs.items():
        d = ROOT / name
        d.mkdir()
        (d / fname).write_bytes(data)

    # buckets.yaml.
    buckets = {
        "buckets-not-multiple-of-4": "buckets:\n  - {name: b1022, patches: 1022}\n",
        "buckets-duplicate-name": "buckets:\n  - {name: a, patches: 64}\n  - {name: a, patches: 128}\n",
        "buckets-too-large": "buckets:\n  - {name: huge, patches: 65536}\n",
        "buckets-malformed-yaml": "buckets: [ {name: a, patches: 64\n",
        "buckets-unknown-field": "buckets:\n  - {name: a, patches: 64, colour: red}\n",
        "buckets-threshold-out-of-range": "buckets:\n  - {name: a, patches: 64}\ngates: {cosine_min: 1.5}\n",
    }
    for name, text in buckets.items():
        d = ROOT / name
        d.mkdir()
        (d / "buckets.yaml").write_text(text)

    # Packages, from a golden MIL case.
    src = GOLDEN / "mil/conv/model.mlpackage"
    def pkg(name):
        d = ROOT / name / "x.mlpackage"
        shutil.copytree(src, d)
        return d
    d = pkg("pkg-protobuf-garbage")
    (d / "Data/com.apple.CoreML/model.mlmodel").write_bytes(b"\xff\xfe garbage \x00" * 8)
    d = pkg("pkg-path-traversal")
    m = json.loads((d / "Manifest.json").read_text())
    for item in m["itemInfoEntries"].values():
        if item["path"].endswith("model.mlmodel"):
            item["path"] = "../../../../etc/passwd"
    (d / "Manifest.json").write_text(json.dumps(m))
    d = pkg("pkg-absolute-path")
    m = json.loads((d / "Manifest.json").read_text())
    for item in m["itemInfoEntries"].values():
        if item["path"].endswith("model.mlmodel"):
            item["path"] = "/etc/passwd"
    (d / "Manifest.json").write_text(json.dumps(m))
    d = pkg("pkg-weights-truncated")
    wb = d / "Data/com.apple.CoreML/weights/weight.bin"
    wb.write_bytes(wb.read_bytes()[:100])
    # A weight offset far past the end of weight.bin (coremltools' own protobuf classes).
    from coremltools.proto import Model_pb2
    d = pkg("pkg-weight-offset-out-of-range")
    mp = d / "Data/com.apple.CoreML/model.mlmodel"
    m = Model_pb2.Model()
    m.ParseFromString(mp.read_bytes())
    f = next(iter(m.mlProgram.functions.values()))
    for op in f.block_specializations[f.opset].operations:
        for v in op.attributes.values():
            if v.HasField("blobFileValue"):
                v.blobFileValue.offset = 1 << 40
                break
    mp.write_bytes(m.SerializeToString())
    d = pkg("pkg-manifest-not-json")
    (d / "Manifest.json").write_text("{ not json")

    # Artifact manifests (no packages needed: the manifest is refused first).
    manifests = {
        "manifest-not-json": "{\"artifact_format\": 1,",
        "manifest-newer-format": json.dumps({"artifact_format": 7, "tool": {"version": "7.0.0"}, "family": "qwen3_vl"}),
        "manifest-missing-config": json.dumps({"artifact_format": 1, "family": "qwen3_vl"}),
        "manifest-other-family": json.dumps({"artifact_format": 1, "family": "paligemma"}),
    }
    for name, text in manifests.items():
        d = ROOT / name / "art"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(text)
    # A manifest whose file list escapes the artifact.
    ok = json.loads((ROOT / "manifest-template.json").read_text())
    ok["files"] = {"../../outside.bin": "00"}
    d = ROOT / "manifest-path-traversal" / "art"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(ok))


if __name__ == "__main__":
    main()
