"""Train the golden tiny Qwen2.5-VL VLM on easy-vqa (`make golden-vlm-q25`; developer-only).

The same data, tokenizer, curriculum and golden question set as the Qwen3-VL
tiny VLM (`make_tiny_vlm.py`, whose pieces this script reuses), with
transformers' `Qwen2_5_VLForConditionalGeneration` at tiny size: patch 14,
window attention (window 112 px, full attention in the last block), RMSNorm,
SwiGLU; a Qwen2 decoder (M-RoPE in sections, q/k/v biases); prompts with the
chat template's default system turn.

Writes (seeded; CPU, --threads fixed):
- golden/tiny-vlm-q25/: config.json, model.safetensors (fp32), tokenizer.json,
  preprocessor_config.json, generation_config.json, TRAINING.md;
- golden/lm/tiny-vlm-q25-<k>.safetensors: language-model parity data of the
  trained model (prompt ids, the image's embeddings, logits, greedy tokens).

golden/vqa/ (written by make_tiny_vlm.py) is read, not rewritten.
Needs the developer venv (torch, transformers, easy-vqa). No network.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import easy_vqa
import PIL
import torch
import transformers
from PIL import Image
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_vlm as base  # noqa: E402

GOLDEN = base.GOLDEN
PATCH, TEMPORAL, MERGE = 14, 2, 2
MIN_PIXELS = 112 * 112  # a 64x64 easy-vqa image becomes 112x112: 64 patches, one window, 16 tokens
MAX_PIXELS = 4096 * PATCH * PATCH
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
SYSTEM = "You are a helpful assistant."
PREPROCESSOR_CONFIG = {
    "patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE, "image_mean": MEAN,
    "image_std": STD, "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "resample": 3, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
    "image_processor_type": "Qwen2VLImageProcessor",
}


def vision_config() -> dict:
    return dict(depth=3, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=128,
                patch_size=PATCH, temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, in_channels=3,
                window_size=112, fullatt_block_indexes=[2], hidden_act="silu")


def text_config(tok) -> dict:
    return dict(vocab_size=base.VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
                bos_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=tok.token_to_id("<|im_end|>"),
                pad_token_id=tok.token_to_id("<|endoftext|>"))


def qwen2_5_vl_model(tok):
    cfg = Qwen2_5_VLConfig(vision_config=vision_config(), text_config=text_config(tok), tie_word_embeddings=True,
                           **base.token_ids(tok))
    return Qwen2_5_VLForConditionalGeneration(cfg), cfg


def main() -> None:
    args = base.training_args(__doc__, GOLDEN)

    train_q, train_img = base.load_split("train")
    test_q, test_img = base.load_split("test")
    train_lab, test_lab = base.labels(train_q, train_img), base.labels(test_q, test_img)
    canvas_texts = [t.format(p=p) for t, _ in base.CANVAS_TEMPLATES for p in base.POSITIONS]
    tok = base.make_tokenizer([q for q, _, _ in train_q + test_q] + canvas_texts, easy_vqa.get_answers())
    processor = Qwen2VLImageProcessor(patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE,
                                      image_mean=MEAN, image_std=STD,
                                      size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
                                      resample=3, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
                                      do_convert_rgb=True)

    model, batcher, secs, log = base.train(args, tok, processor, train_q, train_img, train_lab, test_q, test_img,
                                           test_lab, make_model=qwen2_5_vl_model, system=SYSTEM)

    model_dir = args.out / "tiny-vlm-q25"
    base.save_model(model, tok, model_dir)
    (model_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()

    test_samples = [(Image.fromarray(test_img[i]), q, a) for q, a, i in test_q]
    acc_test = base.accuracy(model, batcher, test_samples)
    held = base.canvas_questions(test_img, test_lab, args.seed + 100, 64,
                                 [(c, c) for c in base.CELLS] + base.GOLDEN_CANVAS_SIZES)
    canvas_samples = [(img, q, a) for _, img, qs in held for q, a in qs]
    acc_canvas = base.accuracy(model, batcher, canvas_samples, bs=16)
    golden = [json.loads(l) for l in (GOLDEN / "vqa" / "questions.jsonl").read_text().splitlines()]
    golden_samples = [(Image.open(GOLDEN / "vqa" / g["image"]).convert("RGB"), g["question"], g["answer"])
                      for g in golden]
    acc_golden = base.accuracy(model, batcher, golden_samples, bs=16)
    print(f"accuracy: test {acc_test:.4f}, canvases {acc_canvas:.4f}, golden {acc_golden:.4f}")

    lm_dir = args.out / "lm"
    for old in lm_dir.glob("tiny-vlm-q25-*.safetensors"):
        old.unlink()
    cases = [(golden_samples[k][0], golden_samples[k][1]) for k in (0, 1)]
    cases += [(golden_samples[k][0], golden_samples[k][1]) for k in (len(golden_samples) - 2, len(golden_samples) - 1)]
    base.write_parity(model, batcher, cases, lm_dir, "tiny-vlm-q25")

    size = (model_dir / "model.safetensors").stat().st_size
    L = ["# The golden tiny Qwen2.5-VL VLM", "",
         "Written by `python/golden/make_tiny_vlm_q25.py` (`make golden-vlm-q25`); do not edit.", "",
         f"Made with torch {torch.__version__}, transformers {transformers.__version__}, pillow {PIL.__version__}, "
         f"easy-vqa (PyPI), python {platform.python_version()} on {platform.machine()}, "
         f"{args.threads} threads, seed {args.seed}.", "",
         "## Model", "",
         "`Qwen2_5_VLForConditionalGeneration` from scratch: vision depth 3 (blocks 0 and 1 attend within "
         "112-pixel windows, block 2 over the image), hidden 64, 4 heads, SwiGLU 128, merger out 128; text 3 Qwen2 "
         "layers, hidden 128, 4 query heads and 2 K/V heads of 32, M-RoPE sections [4, 6, 6], tied embeddings; the "
         f"tiny VLM's word-level tokenizer ({tok.get_vocab_size()} tokens). Preprocessing: patch 14, CLIP mean and "
         f"std, min_pixels {MIN_PIXELS}, max_pixels {MAX_PIXELS}. Prompts carry the system turn `{SYSTEM}`. "
         f"`model.safetensors` fp32, {size / 1e6:.2f} MB.", "",
         "## Training", "",
         f"As the Qwen3-VL tiny VLM's (`golden/tiny-vlm/TRAINING.md`): {args.steps} steps, batch {args.batch}, "
         f"lr {args.lr}. Wall time: **{secs / 60:.1f} min**.", "",
         "## Accuracy (transformers, fp32, greedy, the saved weights)", "",
         "| set | questions | accuracy |", "|---|---|---|",
         f"| easy-vqa test split (all) | {len(test_samples)} | {acc_test * 100:.2f}% |",
         f"| canvases from test images | {len(canvas_samples)} | {acc_canvas * 100:.2f}% |",
         f"| golden set `golden/vqa/questions.jsonl` | {len(golden_samples)} | {acc_golden * 100:.2f}% |", "",
         "## Log", "", "```", *log, "```", ""]
    (model_dir / "TRAINING.md").write_text("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    main()
