#!/usr/bin/env python3
"""Golden data of the task gate: labelled easy-vqa images (deterministic).

Run with the developer venv (easy-vqa installed with `pip install --no-deps easy-vqa==1.0`), no network:

    .venv-dev/bin/python python/golden/make_golden_task.py

It rewrites golden/task/ and touches nothing else:

- golden/task/images/{train,test}-<id>.png: easy-vqa's 64x64 images, copied
  byte for byte: the first TRAIN images of its train split and the first TEST
  of its test split (by image id) whose questions name both the shape and
  its colour;
- golden/task/labels.jsonl: one line per image, `{"image", "split", "labels":
  {"shape", "color"}}`, the labels read from easy-vqa's own answers (an answer
  that is a shape name gives the shape, a colour name the colour).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from easy_vqa import get_test_image_paths, get_test_questions, get_train_image_paths, get_train_questions

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "golden" / "task"
TRAIN, TEST = 300, 150
SHAPES = {"circle", "rectangle", "triangle"}
COLORS = {"black", "blue", "brown", "gray", "green", "red", "teal", "yellow"}


def labelled(questions, answers, ids) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for _, a, i in zip(questions, answers, ids, strict=True):
        d = out.setdefault(int(i), {})
        if a in SHAPES:
            assert d.setdefault("shape", a) == a, f"image {i}: two shapes"
        elif a in COLORS:
            assert d.setdefault("color", a) == a, f"image {i}: two colours"
    return {i: d for i, d in out.items() if len(d) == 2}


def main() -> None:
    shutil.rmtree(OUT / "images", ignore_errors=True)
    (OUT / "images").mkdir(parents=True)
    lines = []
    for split, qs, paths, n in [("train", get_train_questions(), get_train_image_paths(), TRAIN),
                                ("test", get_test_questions(), get_test_image_paths(), TEST)]:
        labels = labelled(*qs)
        for i in sorted(labels)[:n]:
            name = f"images/{split}-{i:04d}.png"
            shutil.copyfile(paths[i], OUT / name)
            lines.append(json.dumps({"image": name, "split": split,
                                     "labels": {"shape": labels[i]["shape"], "color": labels[i]["color"]}}))
        print(f"  {split}: {min(n, len(labels))} of {len(labels)} labelled images")
    (OUT / "labels.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
