#!/usr/bin/env python3
"""Text encoders (issue 54): the Rust reference and the MIL interpreter against
transformers at 128 and 512 tokens, on a MiniLM-L6-shaped and a
BERT-large-shaped (335 M parameters) encoder, side by side in one run, in
GFLOP/s against this machine's fp32 matmul rate (`make bench-text`).

    .venv-dev/bin/python python/bench/bench_text.py [--bin-dir target/release]
        [--shapes minilm-l6 bert-large] [--tokens 128 512] [--rounds 3] [--runs 5]
        [--work DIR] [--out BENCHMARKS.md] [--quick]

The checkpoints: transformers' `BertModel` (with its pooler) of each shape,
its own random initialisation (seed 0), saved with `save_pretrained` (fp32
safetensors) in --work (kept there and reused when --work is given, else in
a temporary directory removed at the end), with golden/models/tiny-bert's
tokenizer files (a WordPiece vocabulary of 1000 ids) and the config's
`vocab_size` 30522 as the released BERTs have it (every tokenizer id is
below it). The text: the tokenizer's whole words, one after another, long
enough that it is truncated to exactly N tokens ([CLS] and [SEP] included),
with no padding: every row runs the same N real tokens.

For each shape and N, `--rounds` rounds, each running every contender once
(so that the shared machine's drift falls on all of them), 2 threads each:
- transformers: a child process loads the checkpoint with
  `BertModel.from_pretrained` in fp32, eager attention,
  `torch.set_num_threads(2)`, tokenizes the text with the checkpoint's fast
  tokenizer (`truncation=True, max_length=N`), batch 1, and under
  `torch.no_grad()` runs one warm-up forward, then times `--runs` forwards
  (their median);
- reference: `ane-export reference --model CK --text T --max-tokens N`, its
  `timing:` line's `forward_s` (the process's one forward, so cold where the
  others are warm; printed to the millisecond);
- interpreter: `ane-run bench --artifact ART --allow-unaccepted --warmup 1
  --runs R --json --precision fp32|fp16` (its `median_s`: the call on
  tokens that fill the bucket) on an artifact built for this N alone
  (`ane-export build --buckets FILE` with one bucket `bN` of N tokens,
  `--residual-scale 1`: a random checkpoint has no massive activations and
  the scale does not change the work).
The table holds the medians over the rounds.

FLOPs of one forward over N tokens (L layers, width D, MLP I): every Linear's
weights once per token, 2 FLOPs per multiply-add, biases not counted:
2 * N * L * (4 D^2 + 2 D I), plus the pooler on the [CLS] row (2 D^2), plus
the attention's two products, 4 * N^2 * D per layer; embeddings, norms,
softmax and GELU are not counted. GFLOP/s is that over the row's seconds,
shown as a fraction of the matmul rate: numpy's sgemm of 4096 x 4096 on the
same threads, best of 5, measured in this run in a child with
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (bench_qwen25.matmul_rate; the
kernels threadpoolctl reports are recorded). "/ transformers" is the row's
seconds over transformers' (below 1: faster than transformers).

Checks: the reference's input ids equal transformers' (N of them), and the
largest difference between the reference's and transformers'
`last_hidden_state` is reported.

Prints a markdown section in the style of BENCHMARKS.md and appends it to
--out. `--quick` (the smoke run): MiniLM-L6 at 128 tokens, 2 rounds of 3
runs. Duration, on a 2-core AMD EPYC (family 23) shared with other work
(numpy at 98-100 GFLOP/s, half its quiet rate): `--quick` 38 s; BERT-large at
512 tokens, one round of one run each, 104 s (checkpoint 15 s, build 12 s,
forwards 3.9 to 8.5 s); from these, the default run is estimated at 13
minutes there, about 8 on the same machine quiet.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_qwen25 as q25  # noqa: E402  (matmul_rate)
import bench_tower as bt  # noqa: E402  (run_measured, child_env, child_call, machine_line, emit)

ROOT = bt.ROOT
TOKENIZER = ROOT / "golden" / "models" / "tiny-bert"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
VOCAB_SIZE = 30522  # bert-base-uncased's, and all-MiniLM-L6-v2's

# The encoders' shapes: all-MiniLM-L6-v2's and bert-large's configurations.
SHAPES = {
    "minilm-l6": {"label": "MiniLM-L6-shaped", "hidden_size": 384, "num_hidden_layers": 6,
                  "num_attention_heads": 12, "intermediate_size": 1536},
    "bert-large": {"label": "BERT-large-shaped", "hidden_size": 1024, "num_hidden_layers": 24,
                   "num_attention_heads": 16, "intermediate_size": 4096},
}
ROWS = (("torch", "transformers fp32"), ("reference", "reference fp32"), ("fp32", "interpreter fp32"),
        ("fp16", "interpreter fp16 emulation"))


def bert_config(shape: str) -> dict:
    s = {k: v for k, v in SHAPES[shape].items() if k != "label"}
    return {**s, "vocab_size": VOCAB_SIZE, "max_position_embeddings": 512, "type_vocab_size": 2,
            "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0}


def flops(shape: str, n: int) -> float:
    """FLOPs of one forward over n tokens, counted as the module docstring says."""
    c = SHAPES[shape]
    d, i, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    return 2.0 * n * layers * (4 * d * d + 2 * d * i) + 2.0 * d * d + 4.0 * n * n * d * layers


# --------------------------------------------------------------------------
# children (torch)
# --------------------------------------------------------------------------


def write_checkpoint(d: str, shape: str, seed: int) -> int:
    """A random `BertModel` of `shape` saved with save_pretrained, with tiny-bert's tokenizer; its parameter count."""
    import torch
    import transformers
    from transformers import BertConfig, BertModel

    transformers.utils.logging.set_verbosity_error()
    vocab = json.loads((TOKENIZER / "tokenizer.json").read_text())["model"]["vocab"]
    assert max(vocab.values()) < VOCAB_SIZE, "the tokenizer's ids must lie below the config's vocab_size"
    torch.manual_seed(seed)
    model = BertModel(BertConfig(**bert_config(shape))).eval()
    out = Path(d)
    model.save_pretrained(out, safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(TOKENIZER / f, out / f)
    return sum(p.numel() for p in model.parameters())


def child_torch(args) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertModel

    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    model, info = BertModel.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager",
                                            output_loading_info=True)
    bad = [k for key in ("missing_keys", "unexpected_keys", "mismatched_keys") for k in (info.get(key) or [])]
    assert not bad, f"weights not loaded from the checkpoint: {sorted(map(str, bad))[:10]}"
    model.eval()
    tok = AutoTokenizer.from_pretrained(args.model)
    enc = tok(args.text, truncation=True, max_length=args.tokens, return_tensors="pt")
    assert enc["input_ids"].shape == (1, args.tokens), f"the text gave {tuple(enc['input_ids'].shape)} ids"
    times = []
    with torch.no_grad():
        for k in range(1 + args.runs):
            t = time.perf_counter()
            out = model(**enc)
            if k:  # the first is the warm-up
                times.append(time.perf_counter() - t)
    save_file({"last_hidden_state": out.last_hidden_state[0].contiguous(),
               "input_ids": enc["input_ids"][0].contiguous()}, args.child_out)
    print(json.dumps({"forward_s": statistics.median(times), "runs_s": times, "threads": torch.get_num_threads(),
                      "versions": f"torch {torch.__version__}, transformers {transformers.__version__}"}))


# --------------------------------------------------------------------------
# parent
# --------------------------------------------------------------------------


def filling_text(n: int) -> str:
    """The tokenizer's whole words in id order, repeated until the text has more than n tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    words = [w for w, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]) if w.isalpha() and w.islower()]
    text = " ".join(words)
    while len(tok.encode(text).ids) <= n:
        text = f"{text} {text}"
    return text


def versions(bin_dir: Path) -> str:
    """The binaries' `--version` first lines, and the commit and build time that locate them."""
    names = []
    for b in ("ane-export", "ane-run"):
        out = subprocess.run([str(bin_dir / b), "--version"], capture_output=True, text=True, check=True).stdout
        names.append(out.splitlines()[0])
    commit = subprocess.run(["git", "-C", str(bin_dir), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    built = dt.datetime.fromtimestamp((bin_dir / "ane-export").stat().st_mtime, dt.timezone.utc)
    return (f"{', '.join(names)} (their checkout at {commit}; ane-export built "
            f"{built.strftime('%Y-%m-%d %H:%M UTC')})")


def reference_run(binary: Path, ck: Path, text: str, n: int, out: Path, env: dict, log: Path) -> float:
    r = bt.run_measured([str(binary), "reference", "--model", str(ck), "--text", text, "--max-tokens", str(n),
                         "--out", str(out)], env, log)
    m = None
    for line in r["stderr"].splitlines():
        m = bt.TIMING_RE.search(line) or m
    if m is None:
        raise SystemExit(f"no `timing:` line from the reference (log: {log}.stderr)")
    return float(m.group(2))


def interpreter_run(run_bin: Path, art: Path, prec: str, runs: int, env: dict, log: Path) -> float:
    r = bt.run_measured([str(run_bin), "bench", "--artifact", str(art), "--allow-unaccepted", "--warmup", "1",
                         "--runs", str(runs), "--json", "--precision", prec], env, log)
    (res,) = json.loads(r["stdout"])["results"]
    return float(res["median_s"])


def torch_run(ck: Path, text: str, n: int, out: Path, args, env: dict, log: Path) -> dict:
    r = bt.run_measured([sys.executable, str(Path(__file__).resolve()), "--child-torch", "--model", str(ck),
                         "--text", text, "--tokens", str(n), "--runs", str(args.runs), "--threads",
                         str(args.threads), "--child-out", str(out)], env, log)
    return json.loads(r["stdout"].strip().splitlines()[-1])


def check_outputs(ref: Path, torch_out: Path, n: int) -> float:
    """The largest |reference - transformers| over `last_hidden_state`, after checking both ran the same n ids."""
    import numpy as np
    from safetensors.numpy import load_file

    a, b = load_file(str(ref)), load_file(str(torch_out))
    if not (a["lengths"].tolist() == [n] and np.array_equal(a["input_ids"], b["input_ids"])):
        raise SystemExit(f"the reference and transformers ran different tokens ({ref}, {torch_out})")
    return float(np.abs(a["last_hidden_state"].astype(np.float64) - b["last_hidden_state"]).max())


def bench_one(shape: str, n: int, ck: Path, paths: dict, work: Path, args, env: dict) -> dict:
    """Build the one-bucket artifact, then `--rounds` rounds of every contender; the medians."""
    tag = f"{shape}-{n}"
    buckets = work / f"buckets-{n}.yaml"
    buckets.write_text(f"buckets:\n  - name: b{n}\n    tokens: {n}\n")
    art = work / f"art-{tag}"
    b = bt.run_measured([str(paths["export"]), "build", "--model", str(ck), "--buckets", str(buckets), "--out",
                         str(art), "--force", "--residual-scale", "1"], env, work / f"build-{tag}")
    weights_mb = sum(f.stat().st_size for f in art.rglob("weight.bin")) / 2**20
    print(f"[{tag}] build {b['wall_s']:.1f} s, fp16 weights {weights_mb:.0f} MB", flush=True)
    text = filling_text(n)
    rounds = []
    for k in range(args.rounds):
        tr = torch_run(ck, text, n, work / f"torch-{tag}.safetensors", args, env, work / f"torch-{tag}")
        r = {"torch": tr["forward_s"],
             "reference": reference_run(paths["export"], ck, text, n, work / f"ref-{tag}.safetensors", env,
                                        work / f"ref-{tag}")}
        for prec in ("fp32", "fp16"):
            r[prec] = interpreter_run(paths["run"], art, prec, args.runs, env, work / f"bench-{tag}-{prec}")
        print(f"[{tag} round {k + 1}/{args.rounds}] " + ", ".join(f"{a} {v * 1e3:.1f} ms" for a, v in r.items()),
              flush=True)
        rounds.append(r)
    row = {key: statistics.median(x[key] for x in rounds) for key in rounds[0]}
    return {"medians": row, "rounds": rounds, "build_s": b["wall_s"], "weights_mb": weights_mb,
            "versions": tr["versions"],
            "max_diff": check_outputs(work / f"ref-{tag}.safetensors", work / f"torch-{tag}.safetensors", n)}


def report(args, results: dict, params: dict, rate: dict, paths: dict) -> list[str]:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    shapes = " and ".join(SHAPES[s]["label"] for s in args.shapes)
    any_res = next(iter(results.values()))
    L = [f"### Text encoders ({shapes}): reference, interpreter, transformers ({stamp})", "",
         f"- command: `{shlex.join([bt._rel(sys.executable)] + [bt._rel(a) for a in sys.argv])}`",
         bt.machine_line(args.threads, rate["gflops"], paths["export"], rate["blas"]),
         f"- binaries: {versions(paths['export'].parent)}; {any_res['versions']}",
         "- encoders: transformers' BertModel (with its pooler), random weights (seed 0), fp32 safetensors, "
         "tiny-bert's tokenizer, vocab_size 30522: "
         + "; ".join(f"{SHAPES[s]['label']} (hidden {SHAPES[s]['hidden_size']}, {SHAPES[s]['num_hidden_layers']} "
                     f"layers, {SHAPES[s]['num_attention_heads']} heads, MLP {SHAPES[s]['intermediate_size']}) "
                     f"{params[s] / 1e6:.1f} M parameters" for s in args.shapes),
         f"- {args.rounds} round(s), medians; transformers: eager attention, batch 1, no grad, the median of "
         f"{args.runs} forwards after a warm-up; reference: `reference --text T --max-tokens N`, its forward_s "
         f"(one cold forward per process, to the millisecond); interpreter: `ane-run bench --runs {args.runs}` "
         "(median, after a warm-up) on an artifact with the one bucket bN (`--residual-scale 1`); FLOPs: "
         "2 x the Linears' weights x N, the pooler's row, and 4 N^2 D per layer for the attention",
         "",
         "| encoder | tokens | run | seconds | / transformers | GFLOP/s | of matmul rate |",
         "|---|---|---|---|---|---|---|"]
    for (shape, n), r in results.items():
        fl, m = flops(shape, n), r["medians"]
        for key, label in ROWS:
            s = m[key]
            L.append(f"| {SHAPES[shape]['label']} | {n} | {label} | {s:.4f} | {s / m['torch']:.2f}x | "
                     f"{fl / s / 1e9:.0f} | {fl / s / 1e9 / rate['gflops']:.0%} |")
    L.append("")
    for (shape, n), r in results.items():
        per = "; ".join(f"{label} " + ", ".join(f"{x[key]:.4f}" for x in r["rounds"]) for key, label in ROWS)
        L.append(f"- {SHAPES[shape]['label']}, {n} tokens ({flops(shape, n) / 1e9:.1f} GFLOP per forward): "
                 f"per round s: {per}; build {r['build_s']:.1f} s (fp16 weights {r['weights_mb']:.0f} MB); "
                 f"same {n} token ids in the reference and transformers, largest |difference| of "
                 f"last_hidden_state {r['max_diff']:.2e}")
    L.append("")
    return L


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "target" / "release",
                    help="directory holding ane-export and ane-run (default: this checkout's target/release)")
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["minilm-l6", "bert-large"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5, help="timed forwards per round (transformers, interpreter)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, help="keep the checkpoints and artifacts here (checkpoints reused)")
    ap.add_argument("--out", type=Path, help="markdown file to append the section to")
    ap.add_argument("--quick", action="store_true", help="smoke run: MiniLM-L6 at 128 tokens, 2 rounds of 3 runs")
    # internal: the transformers child
    ap.add_argument("--child-torch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--text", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_torch:
        args.tokens = args.tokens[0]
        return child_torch(args)
    if args.quick:
        args.shapes, args.tokens, args.rounds, args.runs = ["minilm-l6"], [128], 2, 3
    if any(n < 3 or n > 512 for n in args.tokens):
        ap.error("--tokens: 3 to 512 (BERT's position table)")
    paths = {"export": (args.bin_dir / "ane-export").resolve(), "run": (args.bin_dir / "ane-run").resolve()}
    for p in paths.values():
        if not p.is_file():
            raise SystemExit(f"not found: {p} (make build, or pass --bin-dir)")

    tmp = None if args.work else tempfile.mkdtemp(prefix="bench-text-")
    work = (args.work or Path(tmp)).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = bt.child_env(args.threads)
    t_start = time.perf_counter()
    try:
        rate = q25.matmul_rate(args.threads, work)
        print(f"matmul rate: {rate['gflops']:.0f} GFLOP/s", flush=True)
        params, results = {}, {}
        for shape in args.shapes:
            ck = work / f"bert-{shape}"
            if (ck / "config.json").is_file() and (ck / "model.safetensors").is_file():
                params[shape] = json.loads((ck / "params.json").read_text())["params"]
            else:
                t0 = time.perf_counter()
                params[shape] = bt.child_call(__file__, "write_checkpoint", d=str(ck), shape=shape, seed=0)
                (ck / "params.json").write_text(json.dumps({"params": params[shape]}) + "\n")
                print(f"checkpoint {shape}: {params[shape] / 1e6:.1f} M parameters, "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
            for n in args.tokens:
                results[(shape, n)] = bench_one(shape, n, ck, paths, work, args, env)
        bt.emit(report(args, results, params, rate, paths), args.out)
        print(f"(the run took {time.perf_counter() - t_start:.0f} s)")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__" and not bt.serve_child_call(sys.argv, globals()):
    main()
