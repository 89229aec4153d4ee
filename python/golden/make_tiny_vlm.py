"""Train the golden tiny VLM on easy-vqa (`make golden-vlm`; developer-only).

A model with the exact Qwen3-VL architecture (transformers'
`Qwen3VLForConditionalGeneration`, a tiny config) trained from scratch on
easy-vqa's train split, plus questions about 2x2 canvases composed from four
train images ("what shape is in the top left?", "what color is the shape in
the bottom right?"), so the tower runs in both buckets with heavy padding.

Writes (seeded; CPU with torch's deterministic algorithms and --threads fixed):

- golden/tiny-vlm/: config.json, model.safetensors (fp32), tokenizer.json,
  preprocessor_config.json, generation_config.json; TRAINING.md with the
  training time and accuracies;
- golden/vqa/: the golden question set (questions.jsonl) and its images, held
  out (easy-vqa test images and canvases composed from test images);
- golden/lm/: language-model parity data against transformers for the Rust
  decoder, for the trained model and for a random untied model of the same
  structure (golden/models/tiny-lm-untied/).

Needs the developer venv (torch, transformers, easy-vqa). No network.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import shutil
import time
from pathlib import Path

import easy_vqa
import numpy as np
import PIL
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden"

PATCH, TEMPORAL, MERGE = 16, 2, 2
MIN_PIXELS = 128 * 128  # a 64x64 easy-vqa image becomes 128x128: 64 patches, 16 tokens
MAX_PIXELS = 4096 * PATCH * PATCH  # at most 4096 patches: the largest default bucket
PREPROCESSOR_CONFIG = {
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL,
    "merge_size": MERGE,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "image_processor_type": "Qwen2VLImageProcessorFast",
}

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>"]
UNK = "[UNK]"
NEWLINE = "\n"
VOCAB_SIZE = 128  # padded; the real vocabulary is smaller

POSITIONS = {"top left": (0, 0), "top right": (0, 1), "bottom left": (1, 0), "bottom right": (1, 1)}
CANVAS_TEMPLATES = [("what shape is in the {p}?", "shape"), ("what color is the shape in the {p}?", "color")]
CELLS = [64, 96, 128, 192, 256, 320]  # canvas cell sides: canvases from 128 to 640 px, both buckets
# Training draws small cells more often: they cost what a single image costs, and the
# tower's interpolated position table makes a quadrant look alike at every size.
TRAIN_CELLS = [64, 64, 64, 96, 96, 128, 128, 192, 256, 320]
SHAPE_QUESTIONS = ("what shape is in the image?", "what shape does the image contain?", "what shape is present?")


def vision_config() -> dict:
    return dict(depth=3, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=128,
                deepstack_visual_indexes=[0, 1], num_position_embeddings=256, patch_size=PATCH,
                temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, in_channels=3,
                hidden_act="gelu_pytorch_tanh")


def text_config(tok: Tokenizer, **over) -> dict:
    c = dict(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
             rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [6, 5, 5],
                              "mrope_interleaved": True},
             bos_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=tok.token_to_id("<|im_end|>"),
             pad_token_id=tok.token_to_id("<|endoftext|>"))
    c.update(over)
    return c


def token_ids(tok: Tokenizer) -> dict:
    return dict(image_token_id=tok.token_to_id("<|image_pad|>"), video_token_id=tok.token_to_id("<|video_pad|>"),
                vision_start_token_id=tok.token_to_id("<|vision_start|>"),
                vision_end_token_id=tok.token_to_id("<|vision_end|>"))


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------

def load_split(split: str):
    texts, answers, ids = getattr(easy_vqa, f"get_{split}_questions")()
    paths = getattr(easy_vqa, f"get_{split}_image_paths")()
    images = {i: np.asarray(Image.open(p).convert("RGB")) for i, p in paths.items()}
    return list(zip(texts, answers, ids)), images


def label_image(img: np.ndarray, qs_by_image: dict, image_id: int) -> tuple[str, str]:
    """The shape and colour of an easy-vqa image, from its own questions."""
    shape = color = None
    for q, a in qs_by_image[image_id]:
        if q in ("what shape is in the image?", "what shape does the image contain?", "what shape is present?"):
            shape = a
        if q.startswith("what color is the ") or q.startswith("what is the color of the "):
            color = a
        if q.startswith("what is the ") and q.endswith(" shape?") and q != "what is the color of the shape?":
            shape, color = a, q[len("what is the "):-len(" shape?")]
    return shape, color


def labels(questions, images):
    by_image: dict[int, list] = {}
    for q, a, i in questions:
        by_image.setdefault(i, []).append((q, a))
    out = {}
    for i in images:
        s, c = label_image(images[i], by_image, i)
        if s is not None and c is not None:
            out[i] = (s, c)
    return out


def compose(images, lab, rng: random.Random, cw: int, ch: int):
    """A 2x2 canvas of four images, each resized to a cw x ch cell, and one question about it."""
    ids = rng.sample(sorted(lab), 4)
    canvas = Image.new("RGB", (2 * cw, 2 * ch))
    for k, i in enumerate(ids):
        cell = Image.fromarray(images[i]).resize((cw, ch), Image.BILINEAR)
        canvas.paste(cell, ((k % 2) * cw, (k // 2) * ch))
    pos = rng.choice(sorted(POSITIONS))
    r, c = POSITIONS[pos]
    tmpl, kind = rng.choice(CANVAS_TEMPLATES)
    shape, color = lab[ids[2 * r + c]]
    return canvas, tmpl.format(p=pos), shape if kind == "shape" else color


def make_tokenizer(all_texts: list[str], answers: list[str]) -> Tokenizer:
    norm = normalizers.Lowercase()
    pre = pre_tokenizers.Whitespace()
    words = set(answers) | {"user", "assistant"}
    for t in all_texts:
        for w, _ in pre.pre_tokenize_str(norm.normalize_str(t)):
            words.add(w)
    vocab = {}
    for t in SPECIAL + [UNK] + sorted(words):
        vocab[t] = len(vocab)
    assert len(vocab) + 1 <= VOCAB_SIZE, len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(NEWLINE, special=False, normalized=False)])
    return tok


def prompt_ids(tok: Tokenizer, n_image_tokens: int, question: str, system: str | None = None) -> list[int]:
    """The Qwen3-VL chat template for one image and one question, generation prompt included; with
    `system`, the system turn the Qwen2-VL and Qwen2.5-VL templates add first."""
    text = ("<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * n_image_tokens + "<|vision_end|>"
            + question + "<|im_end|>\n<|im_start|>assistant\n")
    if system is not None:
        text = f"<|im_start|>system\n{system}<|im_end|>\n" + text
    return tok.encode(text, add_special_tokens=False).ids


class Batcher:
    def __init__(self, tok: Tokenizer, processor, model_cfg, system: str | None = None):
        self.tok, self.proc, self.system = tok, processor, system
        self.image_id = model_cfg.image_token_id
        self.pad = tok.token_to_id("<|endoftext|>")
        self.end = tok.token_to_id("<|im_end|>")

    def pixels(self, imgs):
        out = self.proc(images=imgs, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def batch(self, imgs, questions, answers=None):
        pv, grid = self.pixels(imgs)
        seqs, labs = [], []
        for k, q in enumerate(questions):
            n = int(grid[k].prod()) // (MERGE * MERGE)
            ids = prompt_ids(self.tok, n, q, self.system)
            lab = [-100] * len(ids)
            if answers is not None:
                a = self.tok.encode(answers[k] + "<|im_end|>", add_special_tokens=False).ids
                ids, lab = ids + a, lab + a
            seqs.append(ids)
            labs.append(lab)
        L = max(map(len, seqs))
        ids = torch.full((len(seqs), L), self.pad, dtype=torch.long)
        att = torch.zeros((len(seqs), L), dtype=torch.long)
        lab = torch.full((len(seqs), L), -100, dtype=torch.long)
        for k, (s, l) in enumerate(zip(seqs, labs)):
            ids[k, : len(s)] = torch.tensor(s)
            att[k, : len(s)] = 1
            lab[k, : len(l)] = torch.tensor(l)
        mm = (ids == self.image_id).to(torch.int32)
        return dict(input_ids=ids, attention_mask=att, pixel_values=pv, image_grid_thw=grid,
                    mm_token_type_ids=mm), lab


@torch.no_grad()
def answer_batch(model, batcher: Batcher, imgs, questions) -> list[str]:
    """Greedy first token at the end of each prompt (answers are one word then <|im_end|>)."""
    inputs, _ = batcher.batch(imgs, questions)
    logits = model(**inputs).logits
    last = inputs["attention_mask"].sum(1) - 1
    ids = logits[torch.arange(len(questions)), last].argmax(-1)
    return [batcher.tok.decode([int(i)]) for i in ids]


def accuracy(model, batcher, samples, bs=64) -> float:
    """samples: (PIL image, question, answer)."""
    model.eval()
    right = 0
    for s in range(0, len(samples), bs):
        chunk = samples[s: s + bs]
        got = answer_batch(model, batcher, [c[0] for c in chunk], [c[1] for c in chunk])
        right += sum(g == c[2] for g, c in zip(got, chunk))
    model.train()
    return right / len(samples)


# --------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------

def qwen3_vl_model(tok: Tokenizer):
    """The golden tiny VLM's architecture, untrained, and its config."""
    cfg = Qwen3VLConfig(vision_config=vision_config(), text_config=text_config(tok), tie_word_embeddings=True,
                        **token_ids(tok))
    return Qwen3VLForConditionalGeneration(cfg), cfg


def train(args, tok, processor, train_q, train_img, train_lab, test_q, test_img, test_lab,
          make_model=qwen3_vl_model, system=None):
    """Train `make_model(tok)` (model, config) from seed `args.seed`; `system`: the prompt's system turn."""
    torch.manual_seed(args.seed)
    model, cfg = make_model(tok)
    model.train()
    batcher = Batcher(tok, processor, cfg, system)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    rng = random.Random(args.seed)
    order = list(range(len(train_q)))
    what_order = [k for k in order if train_q[k][0].startswith("what")]
    shape_order = [k for k in what_order if train_q[k][0] in SHAPE_QUESTIONS]
    other_what = [k for k in what_order if train_q[k][0] not in SHAPE_QUESTIONS]
    warm = 100

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        p = (step - warm) / max(1, args.steps - warm)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * p)))

    pil_cache = {}

    def pil(images, i):
        if (id(images), i) not in pil_cache:
            pil_cache[(id(images), i)] = Image.fromarray(images[i])
        return pil_cache[(id(images), i)]

    pos = len(order)
    t0 = time.time()
    log = []
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        if step >= args.canvas_from and step % args.canvas_every == args.canvas_every - 1:
            cell = rng.choice(TRAIN_CELLS)
            cw, ch = cell, rng.choice([c for c in CELLS if c <= 2 * cell and 2 * c >= cell])
            if rng.random() < 0.5:
                cw, ch = ch, cw
            items = [compose(train_img, train_lab, rng, cw, ch) for _ in range(args.canvas_batch)]
            imgs, qs, ans = zip(*items)
        else:
            # curriculum: "what ..." questions first, so the tower learns shapes and colours
            # before the yes/no questions ask to compare them with words of the question
            if step >= args.what_first:
                if pos + args.batch > len(order):
                    rng.shuffle(order)
                    pos = 0
                chunk = [train_q[k] for k in order[pos: pos + args.batch]]
                pos += args.batch
            else:
                # half of them "what shape ...": shapes are what the tower learns slowest
                half = args.batch // 2
                chunk = [train_q[k] for k in rng.sample(shape_order, half) + rng.sample(other_what, args.batch - half)]
            imgs = [pil(train_img, c[2]) for c in chunk]
            qs = [c[0] for c in chunk]
            ans = [c[1] for c in chunk]
        inputs, lab = batcher.batch(list(imgs), list(qs), list(ans))
        out = model(**inputs, labels=lab)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            line = f"step {step:5d} loss {out.loss.item():.4f} lr {lr_at(step):.2e} {time.time() - t0:7.1f}s"
            print(line, flush=True)
            log.append(line)
        if args.eval_every and step and step % args.eval_every == 0:
            sub = [(pil(test_img, i), q, a) for q, a, i in test_q[:512]]
            print(f"  eval: test accuracy (512 questions) {accuracy(model, batcher, sub):.3f}", flush=True)
    return model, batcher, time.time() - t0, log


# --------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------

def save_model(model, tok, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")


def canvas_questions(test_img, test_lab, seed: int, n: int, sizes):
    out = []
    for k in range(n):
        r = random.Random(seed * 7919 + k)
        cw, ch = sizes[k % len(sizes)]
        ids = r.sample(sorted(test_lab), 4)
        canvas = Image.new("RGB", (2 * cw, 2 * ch))
        for j, i in enumerate(ids):
            canvas.paste(Image.fromarray(test_img[i]).resize((cw, ch), Image.BILINEAR), ((j % 2) * cw, (j // 2) * ch))
        qs = []
        for pos, (rr, cc) in POSITIONS.items():
            shape, color = test_lab[ids[2 * rr + cc]]
            for tmpl, kind in CANVAS_TEMPLATES:
                qs.append((tmpl.format(p=pos), shape if kind == "shape" else color))
        out.append((f"canvas-{k:02d}-{2 * cw}x{2 * ch}.png", canvas, qs))
    return out


GOLDEN_CANVAS_SIZES = [(64, 64), (96, 128), (192, 96), (256, 256), (320, 288), (288, 320), (320, 320), (128, 320)]


def write_vqa(singles, canvases, out: Path) -> int:
    if out.exists():
        shutil.rmtree(out)
    (out / "images").mkdir(parents=True)
    lines = []
    for name, img, q, a in singles:
        p = out / "images" / name
        if not p.exists():
            img.save(p)
        lines.append(dict(image=f"images/{name}", question=q, answer=a))
    for name, img, qs in canvases:
        img.save(out / "images" / name)
        # two questions per canvas (rotating positions) keep the gate quick
        for q, a in qs[::4] + qs[1::8]:
            lines.append(dict(image=f"images/{name}", question=q, answer=a))
    (out / "questions.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    return len(lines)


@torch.no_grad()
def parity_case(model, batcher, img, question, max_new: int = 4) -> dict[str, torch.Tensor]:
    """transformers' vision output, prompt logits and greedy tokens for one question."""
    model.eval()
    inputs, _ = batcher.batch([img], [question])
    vis = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    logits = model(**inputs).logits[0]
    gen = model.generate(**inputs, max_new_tokens=max_new, do_sample=False)
    new = gen[0, inputs["input_ids"].shape[1]:]
    t = {"input_ids": inputs["input_ids"][0], "grid_thw": inputs["image_grid_thw"],
         "embeds": vis.pooler_output[0].contiguous(), "logits": logits.contiguous(), "generated": new}
    for k, f in enumerate(getattr(vis, "deepstack_features", None) or []):
        t[f"deepstack.{k}"] = f[0].contiguous()
    return t


def write_parity(model, batcher, cases, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for k, (img, q) in enumerate(cases):
        t = parity_case(model, batcher, img, q)
        save_file({a: b.contiguous() for a, b in t.items()}, out / f"{name}-{k}.safetensors",
                  metadata={"question": q, "model": name})


def training_args(doc: str, out: Path) -> argparse.Namespace:
    """The training options (shared with make_tiny_vlm_q25.py), parsed, with
    torch, random and numpy seeded and torch held to --threads threads and
    its deterministic algorithms."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--what-first", type=int, default=1500)
    ap.add_argument("--canvas-from", type=int, default=1500)
    ap.add_argument("--canvas-batch", type=int, default=16)
    ap.add_argument("--canvas-every", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=out)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    return args


def main() -> None:
    args = training_args(__doc__, GOLDEN)

    train_q, train_img = load_split("train")
    test_q, test_img = load_split("test")
    train_lab, test_lab = labels(train_q, train_img), labels(test_q, test_img)
    print(f"labelled {len(train_lab)}/{len(train_img)} train and {len(test_lab)}/{len(test_img)} test images")
    canvas_texts = [t.format(p=p) for t, _ in CANVAS_TEMPLATES for p in POSITIONS]
    answers = easy_vqa.get_answers()
    tok = make_tokenizer([q for q, _, _ in train_q + test_q] + canvas_texts, answers)
    processor = Qwen2VLImageProcessor(patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE,
                                      image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                      size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
                                      resample=3, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
                                      do_convert_rgb=True)

    model, batcher, secs, log = train(args, tok, processor, train_q, train_img, train_lab, test_q, test_img,
                                      test_lab)

    model_dir = args.out / "tiny-vlm"
    save_model(model, tok, model_dir)
    # measure with the saved weights, reloaded
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()

    test_samples = [(Image.fromarray(test_img[i]), q, a) for q, a, i in test_q]
    acc_test = accuracy(model, batcher, test_samples)
    held_canvas = canvas_questions(test_img, test_lab, args.seed + 100, 64,
                                   [(c, c) for c in CELLS] + GOLDEN_CANVAS_SIZES)
    canvas_samples = [(img, q, a) for _, img, qs in held_canvas for q, a in qs]
    acc_canvas = accuracy(model, batcher, canvas_samples, bs=16)
    print(f"test accuracy {acc_test:.4f} on {len(test_samples)} questions; canvases {acc_canvas:.4f} "
          f"on {len(canvas_samples)}")

    rng = random.Random(args.seed + 1)
    by_image: dict[int, list] = {}
    for q, a, i in test_q:
        by_image.setdefault(i, []).append((q, a))
    singles = []
    for i in sorted(by_image)[:40]:
        for q, a in rng.sample(by_image[i], min(2, len(by_image[i]))):
            singles.append((f"test-{i:04d}.png", Image.fromarray(test_img[i]), q, a))
    canvases = canvas_questions(test_img, test_lab, args.seed + 200, len(GOLDEN_CANVAS_SIZES),
                                GOLDEN_CANVAS_SIZES)
    n_golden = write_vqa(singles, canvases, args.out / "vqa")
    golden_samples = [(img, q, a) for _, img, q, a in singles] + \
        [(img, q, a) for _, img, qs in canvases for q, a in qs[::4] + qs[1::8]]
    acc_golden = accuracy(model, batcher, golden_samples, bs=16)

    lm_dir = args.out / "lm"
    if lm_dir.exists():
        shutil.rmtree(lm_dir)
    cases = [(singles[0][1], singles[0][2]), (singles[1][1], singles[1][2]),
             (canvases[0][1], canvases[0][2][0][0]), (canvases[6][1], canvases[6][2][3][0])]
    write_parity(model, batcher, cases, lm_dir, "tiny-vlm")

    # a random model with an untied lm_head and full multi-head K/V: the structure of the larger checkpoints
    torch.manual_seed(args.seed + 7)
    ucfg = Qwen3VLConfig(vision_config=vision_config(),
                         text_config=text_config(tok, num_key_value_heads=4, num_hidden_layers=2,
                                                 intermediate_size=192),
                         tie_word_embeddings=False, **token_ids(tok))
    umodel = Qwen3VLForConditionalGeneration(ucfg).eval()
    with torch.no_grad():
        for p in umodel.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.08)
    udir = args.out / "models" / "tiny-lm-untied"
    save_model(umodel, tok, udir)
    write_parity(umodel, Batcher(tok, processor, ucfg), cases[:2], lm_dir, "tiny-lm-untied")

    size = (model_dir / "model.safetensors").stat().st_size
    L = ["# The golden tiny VLM", "",
         "Written by `python/golden/make_tiny_vlm.py` (`make golden-vlm`); do not edit.", "",
         f"Made with torch {torch.__version__}, transformers {transformers.__version__}, pillow {PIL.__version__}, "
         f"easy-vqa (PyPI), python {platform.python_version()} on {platform.machine()}, "
         f"{args.threads} threads, seed {args.seed}.", "",
         "## Model", "",
         "`Qwen3VLForConditionalGeneration` from scratch: vision depth 3, hidden 64, 4 heads, deepstack "
         "after blocks 0 and 1, merger out 128; text 3 Qwen3 layers, hidden 128, 4 query heads and 2 K/V heads "
         "of 32, interleaved M-RoPE sections [6, 5, 5], tied embeddings; a word-level tokenizer "
         f"({tok.get_vocab_size()} tokens). Preprocessing: min_pixels {MIN_PIXELS} (a 64x64 image becomes 128x128, "
         f"64 patches), max_pixels {MAX_PIXELS}. `model.safetensors` fp32, {size / 1e6:.2f} MB.", "",
         "## Training", "",
         f"{args.steps} AdamW steps (lr {args.lr}, warm-up then cosine), batches of {args.batch} easy-vqa train "
         f"questions: only \"what ...\" questions for the first {args.what_first} steps, half of them about the shape "
         f"(the tower learns shapes and colours before yes/no questions ask to compare them with the question's "
         f"words), then all; from "
         f"step {args.canvas_from}, one step in {args.canvas_every} takes a batch of {args.canvas_batch} questions about "
         f"2x2 canvases composed from train images (cells drawn from {TRAIN_CELLS} px). Train split only. "
         f"Wall time: **{secs / 60:.1f} min**.", "",
         "## Accuracy (transformers, fp32, greedy, the saved weights)", "",
         "| set | questions | accuracy |", "|---|---|---|",
         f"| easy-vqa test split (all) | {len(test_samples)} | {acc_test * 100:.2f}% |",
         f"| canvases from test images | {len(canvas_samples)} | {acc_canvas * 100:.2f}% |",
         f"| golden set `golden/vqa/questions.jsonl` | {n_golden} | {acc_golden * 100:.2f}% |", "",
         "## Log", "", "```", *log, "```", ""]
    (model_dir / "TRAINING.md").write_text("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    main()
