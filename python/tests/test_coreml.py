"""The Mac-only Core ML module: what can be checked without macOS.

The plan summary runs on recorded-shape fakes of coremltools' compute-plan
objects (nested blocks included); the file format round-trips; on Linux the
commands refuse with a clear message instead of crashing."""

import json
import sys
from dataclasses import dataclass, field

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
