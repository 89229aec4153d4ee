"""The Mac-only Core ML module: what can be checked without macOS.

The plan summary runs on recorded-shape fakes of coremltools' compute-plan
objects (nested blocks included); the file format round-trips; on Linux the
commands refuse with a clear message instead of crashing; the loader runs
on the pinned coremltools itself, which reads packages on any OS."""

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from ane_export import coreml


class MLNeuralEngineComputeDevice:
    pass


class MLCPUComputeDevice:
    pass


class MLGPUComputeDevice:
    pass


@dataclass
class Named:
    name: str


@dataclass
class Op:
    operator_name: str
    outputs: list
    blocks: list = field(default_factory=list)


@dataclass
class Block:
    operations: list


@dataclass
class Usage:
    preferred_compute_device: object
    supported_compute_devices: list


@dataclass
class Cost:
    weight: float


class FakePlan:
    def __init__(self, table):
        self.table = table  # op name -> (preferred, supported, weight)

    def get_compute_device_usage_for_mlprogram_operation(self, op):
        pref, sup, _ = self.table[op.outputs[0].name]
        return Usage(pref(), [s() for s in sup]) if pref else None

    def get_estimated_cost_for_mlprogram_operation(self, op):
        return Cost(self.table[op.outputs[0].name][2])


def test_summarise_recurses_into_nested_blocks():
    inner = Block([Op("gather", [Named("g")])])
    block = Block([
        Op("conv", [Named("c")]),
        Op("cond", [Named("if")], blocks=[inner]),
        Op("softmax", [Named("s")]),
    ])
    ne, cpu, gpu = MLNeuralEngineComputeDevice, MLCPUComputeDevice, MLGPUComputeDevice
    plan = FakePlan({
        "c": (ne, [ne, cpu, gpu], 0.7),
        "if": (cpu, [cpu], 0.0),
        "g": (cpu, [cpu], 0.1),
        "s": (None, [], 0.2),
    })
    rows = coreml.summarise(plan, block)
    assert [r["op"] for r in rows] == ["c", "if", "g", "s"]
    assert [r["device"] for r in rows] == ["ane", "cpu", "cpu", "unknown"]
    assert rows[0]["supported"] == ["ane", "cpu", "gpu"]
    assert rows[2]["block"] == "if/0/"
    assert abs(sum(r["cost"] for r in rows) - 1.0) < 1e-9


def test_safetensors_round_trip(tmp_path):
    p = tmp_path / "t.safetensors"
    t = {"mask": np.full((1, 4, 4), -1e4, np.float32), "pos": np.arange(6, dtype=np.float32).reshape(1, 3, 1, 2)}
    coreml.write_safetensors(p, t)
    back = coreml.read_safetensors(p)
    assert set(back) == {"mask", "pos"}
    for k in t:
        np.testing.assert_array_equal(back[k], t[k])
    p.write_bytes(b"\x00" * 4)
    with pytest.raises(ValueError, match="not a safetensors file"):
        coreml.read_safetensors(p)


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
def test_commands_refuse_off_macos(tmp_path, capsys):
    inp = tmp_path / "in.safetensors"
    coreml.write_safetensors(inp, {"x": np.zeros((1, 2), np.float32)})
    code = coreml.main(["predict", "x.mlpackage", "b1024", str(inp), str(tmp_path / "out.safetensors")])
    assert code == 2
    assert "need macOS" in capsys.readouterr().err
    assert coreml.main(["plan", "x.mlpackage", "b1024", str(tmp_path / "plan.json")]) == 2
    assert not (tmp_path / "plan.json").exists()
    with pytest.raises(SystemExit):
        coreml.main(["plan", "x.mlpackage", "b1024", "o.json", "--compute-units", "GPU_ONLY"])


def test_device_names():
    assert coreml.device_name(MLNeuralEngineComputeDevice()) == "ane"
    assert coreml.device_name(object()) == "unknown"
    json.dumps(coreml.COMPUTE_UNITS)


class _Doubler:
    """A stand-in for a loaded Core ML model: every input times two, as `y_<name>`."""

    def predict(self, feed):
        return {f"y_{k}": v * 2 for k, v in feed.items()}


def test_serve_keeps_each_function_loaded_and_survives_a_bad_request(tmp_path):
    import io

    loads = []

    def load(pkg, function, units):
        loads.append((pkg, function, units))
        if function == "broken":
            raise RuntimeError("compile failed")
        return _Doubler()

    inp = tmp_path / "in.safetensors"
    coreml.write_safetensors(inp, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    reqs = [
        {"function": "b1024", "inputs": str(inp), "out": str(tmp_path / "o1.safetensors")},
        {"function": "b1024", "inputs": str(inp), "out": str(tmp_path / "o2.safetensors")},
        {"function": "broken", "inputs": str(inp), "out": str(tmp_path / "o3.safetensors")},
        {"function": "b1024", "inputs": str(tmp_path / "absent.safetensors"), "out": str(tmp_path / "o4.safetensors")},
        {"function": "b4096"},
        {"function": "b4096", "inputs": str(inp), "out": str(tmp_path / "o5.safetensors")},
    ]
    requests = io.StringIO("\n".join(json.dumps(r) for r in reqs) + "\n\n[1]\n")
    replies = io.StringIO()
    coreml.serve("x.mlpackage", "CPU_AND_NE", requests, replies, load=load)
    got = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert [g["ok"] for g in got] == [True, True, False, False, False, True, False]
    assert got[0]["load_s"] >= 0 and got[1]["load_s"] == 0.0
    assert "compile failed" in got[2]["error"]
    assert "absent.safetensors" in got[3]["error"]
    assert "KeyError" in got[4]["error"] and "a request is a JSON object" in got[6]["error"]
    # Whether the model is loaded after each request, also after a failed prediction.
    assert [g["loaded"] for g in got] == [True, True, False, True, False, True, False]
    # b1024 loaded once for two predictions; the broken function's load is retried per request.
    assert [f for _, f, _ in loads] == ["b1024", "broken", "b4096"]
    out = coreml.read_safetensors(tmp_path / "o2.safetensors")
    assert np.array_equal(out["y_x"], np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
    assert not (tmp_path / "o3.safetensors").exists()


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
def test_serve_refuses_off_macos_without_writing_a_reply():
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(Path(coreml.__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-m", "ane_export.coreml", "serve", "x.mlpackage"],
                       input="", capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2
    assert "need macOS" in r.stderr
    assert r.stdout == ""


GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "mil"


def test_load_opens_each_function_of_a_multifunction_package_with_the_units_asked():
    """`_load` with the pinned coremltools itself: on Linux it reads the
    package and checks the function name, though it cannot predict."""
    pkg = str(GOLDEN / "multifunction" / "model.mlpackage")
    for function in ("b8", "b16"):
        for units in ("CPU_ONLY", "CPU_AND_NE", "ALL"):
            m = coreml._load(pkg, function, units)
            assert m.function_name == function
            assert m.compute_unit.name == units
    with pytest.raises(ValueError, match="b9"):
        coreml._load(pkg, "b9", "CPU_AND_NE")
    with pytest.raises(ValueError, match="compute units 'NE_ONLY'"):
        coreml._load(pkg, "b8", "NE_ONLY")


@pytest.mark.skipif(sys.platform == "darwin", reason="Linux cannot predict: checks the reply that says so")
def test_serve_with_the_real_loader_reports_that_linux_cannot_predict(tmp_path):
    import io

    pkg = str(GOLDEN / "multifunction" / "model.mlpackage")
    inp = tmp_path / "in.safetensors"
    coreml.write_safetensors(inp, {"x": np.zeros((1, 8), dtype=np.float32)})
    req = {"function": "b8", "inputs": str(inp), "out": str(tmp_path / "out.safetensors")}
    replies = io.StringIO()
    coreml.serve(pkg, "CPU_AND_NE", io.StringIO(json.dumps(req) + "\n"), replies)
    (reply,) = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert reply["ok"] is False and "macOS" in reply["error"]
    assert reply["loaded"] is True


def test_the_plan_uses_names_the_pinned_coremltools_has():
    """`plan` cannot run off macOS; the names it calls are checked here, so
    a coremltools pin that renames them fails on any OS."""
    import inspect

    import coremltools as ct
    from coremltools.models import compute_device
    from coremltools.models.compute_plan import MLComputePlan

    for name in ("load_from_path", "get_compute_device_usage_for_mlprogram_operation",
                 "get_estimated_cost_for_mlprogram_operation", "model_structure"):
        assert hasattr(MLComputePlan, name), name
    assert "compute_units" in inspect.signature(MLComputePlan.load_from_path).parameters
    assert hasattr(ct.models.MLModel, "get_compiled_model_path")
    # device_name knows coremltools' own device classes.
    for cls, name in ((compute_device.MLNeuralEngineComputeDevice, "ane"),
                      (compute_device.MLGPUComputeDevice, "gpu"),
                      (compute_device.MLCPUComputeDevice, "cpu")):
        assert coreml.device_name(object.__new__(cls)) == name
