"""The Core AI module's other half: the pin, the ops listing the residency
gate reads, and the `serve` child the Rust executor drives (the protocol of
`ane_export.coreml serve`), run for real on a small translated program."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ane_export import EnvironmentError_, coreml
from test_interp_ops import build

coreai = pytest.importorskip("ane_export.coreai")

ROOT = Path(__file__).resolve().parents[1]


def small_aimodel(tmp_path):
    """A two-op program (1x1 conv with bias, then GELU) translated into an
    `.aimodel` with two graphs, `b8` and `b16`."""
    from coremltools.converters.mil import Builder as mb

    w = np.linspace(-0.5, 0.5, 6 * 4).reshape(6, 4, 1, 1).astype(np.float16)
    b = np.linspace(-1, 1, 6).astype(np.float16)
    sources = []
    for n in (8, 16):
        def body(x):
            h = mb.cast(x=x, dtype="fp16")
            y = mb.conv(x=h, weight=w, bias=b, strides=[1, 1], pad_type="valid")
            return mb.cast(x=mb.gelu(x=y, mode="EXACT"), dtype="fp32")

        pkg, _ = build(tmp_path, f"p{n}", {"x": np.zeros((1, 4, 1, n), np.float32)}, body)
        sources.append((str(pkg), "main", f"b{n}"))
    out = tmp_path / "small.aimodel"
    summary = coreai.save_aimodel(sources, str(out))
    return out, summary, w.astype(np.float64), b.astype(np.float64)


def test_the_pin_holds_and_a_wrong_pin_is_named():
    assert coreai.check_environment()["coreai-core"] == coreai.PINNED["coreai-core"]
    from ane_export import environment

    with pytest.raises(EnvironmentError_, match="the project pins 0.0.1"):
        environment.check_environment({"coreai-core": "0.0.1"})


def test_graphs_named_like_buckets_share_one_copy_of_the_weights(tmp_path):
    out, summary, _, _ = small_aimodel(tmp_path)
    assert sorted(os.listdir(out)) == ["main.hash", "main.mlirb", "metadata.json"]
    assert set(summary["functions"]) == {"b8", "b16"}
    for f in summary["functions"].values():
        assert f["mil_ops"] == {"cast": 2, "conv": 1, "gelu": 1}
        assert f["ops"] == {"coreai.decomposable.broadcasting_add": 1, "coreai.cast": 2, "coreai.conv2d": 1,
                            "coreai.gelu": 1}
    ops = coreai.list_ops(str(out))
    conv = [r for r in ops["b16"] if r["op"] == "coreai.conv2d"][0]
    assert conv["operands"][0] == {"dtype": "f16", "shape": [1, 4, 1, 16]}
    assert conv["results"] == [{"dtype": "f16", "shape": [1, 6, 1, 16]}]
    assert ops["b8"][0] == {"op": "coreai.cast", "operands": [{"dtype": "f32", "shape": [1, 4, 1, 8]}],
                            "results": [{"dtype": "f16", "shape": [1, 4, 1, 8]}]}


def test_an_existing_output_is_not_overwritten(tmp_path):
    out, _, _, _ = small_aimodel(tmp_path)
    before = (out / "main.mlirb").read_bytes()
    with pytest.raises(FileExistsError):
        coreai.save_aimodel([(str(tmp_path / "p8.mlpackage"), "main", "b8")], str(out))
    assert (out / "main.mlirb").read_bytes() == before


def _child(args, stdin=""):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ane_export.coreai", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=300)


def test_serve_runs_each_graph_and_survives_bad_requests(tmp_path):
    from math import erf

    out, _, w, b = small_aimodel(tmp_path)
    x = np.linspace(-2, 2, 4 * 16).reshape(1, 4, 1, 16).astype(np.float32)
    inp = tmp_path / "in.safetensors"
    coreml.write_safetensors(inp, {"x": x})
    reqs = [
        {"function": "b16", "inputs": str(inp), "out": str(tmp_path / "o1.safetensors")},
        {"function": "b16", "inputs": str(inp), "out": str(tmp_path / "o2.safetensors")},
        {"function": "b8", "inputs": str(inp), "out": str(tmp_path / "o3.safetensors")},
        {"function": "b32", "inputs": str(inp), "out": str(tmp_path / "o4.safetensors")},
    ]
    r = _child(["serve", str(out), "--compute-units", "CPU_AND_NE"],
               "\n".join(json.dumps(q) for q in reqs) + "\n")
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [g["ok"] for g in got] == [True, True, False, False], got
    assert got[0]["loaded"] and got[1]["load_s"] == 0.0
    assert "shape" in got[2]["error"] or "Shape" in got[2]["error"], got[2]
    assert "no function 'b32'" in got[3]["error"]
    (y,) = coreml.read_safetensors(tmp_path / "o2.safetensors").values()
    h = np.einsum("oc,bchs->bohs", w[:, :, 0, 0], x.astype(np.float16).astype(np.float64)) + b.reshape(1, -1, 1, 1)
    want = 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))
    assert y.shape == (1, 6, 1, 16)
    assert np.abs(y - want).max() <= 4 * 2.0 ** -10 * np.abs(want).max()
    assert not (tmp_path / "o3.safetensors").exists()


def test_ops_command_writes_the_listing_and_errors_exit_2(tmp_path):
    out, _, _, _ = small_aimodel(tmp_path)
    r = _child(["ops", str(out), str(tmp_path / "ops.json")])
    assert r.returncode == 0, r.stderr
    listing = json.loads((tmp_path / "ops.json").read_text())
    assert set(listing["functions"]) == {"b8", "b16"}
    r = _child(["ops", str(tmp_path / "absent.aimodel"), str(tmp_path / "x.json")])
    assert r.returncode == 2 and "error:" in r.stderr
    assert not (tmp_path / "x.json").exists()
