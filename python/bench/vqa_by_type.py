#!/usr/bin/env python3
"""Accuracy of golden/tiny-vlm by easy-vqa question type (transformers, fp32, greedy).

    .venv-dev/bin/python python/bench/vqa_by_type.py [--questions 2000]

Types: colour and shape "what" questions, "what is the <colour> shape?", and
yes/no questions about a colour or a shape, with and without negation.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from PIL import Image
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
import make_tiny_vlm as m  # noqa: E402

COLOURS = ["red", "green", "blue", "yellow", "teal", "brown", "gray", "black"]


def kind(q: str) -> str:
    if q.startswith("what color") or q.startswith("what is the color"):
        return "what colour"
    if q.startswith("what is the "):
        return "what is the <colour> shape"
    if q.startswith("what"):
        return "what shape"
    neg = " not " in q or q.startswith("is no")
    col = any(c in q for c in COLOURS)
    return ("yes/no, negated, " if neg else "yes/no, ") + ("colour" if col else "shape")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=2000, help="first N test questions")
    args = ap.parse_args()
    torch.set_num_threads(2)
    d = m.GOLDEN / "tiny-vlm"
    model = m.Qwen3VLForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    proc = m.Qwen2VLImageProcessor(**{k: v for k, v in m.PREPROCESSOR_CONFIG.items() if k != "image_processor_type"})
    b = m.Batcher(tok, proc, model.config)
    qs, imgs = m.load_split("test")
    qs = qs[: args.questions]
    res = collections.defaultdict(lambda: [0, 0])
    for s in range(0, len(qs), 64):
        chunk = qs[s: s + 64]
        got = m.answer_batch(model, b, [Image.fromarray(imgs[c[2]]) for c in chunk], [c[0] for c in chunk])
        for g, (q, a, _) in zip(got, chunk):
            res[kind(q)][0] += g == a
            res[kind(q)][1] += 1
    print("| question type | questions | accuracy |\n|---|---|---|")
    for k, (r, n) in sorted(res.items()):
        print(f"| {k} | {n} | {100 * r / n:.1f}% |")


if __name__ == "__main__":
    main()
