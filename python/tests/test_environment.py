"""The pinned coremltools is present and can write ML programs on this OS."""

import json
import os

import numpy as np
import pytest
from ane_export import EnvironmentError_, check_environment


def test_pins_hold():
    versions = check_environment()
    assert versions["coremltools"] == "9.0"
    assert "numpy" in versions


def test_mismatched_pin_names_package_and_versions():
    with pytest.raises(EnvironmentError_) as e:
        check_environment({"coremltools": "0.0.1"})
    assert "coremltools 9.0 is installed, the project pins 0.0.1" in str(e.value)
    with pytest.raises(EnvironmentError_) as e:
        check_environment({"no-such-package-xyz": "1"})
    assert "no-such-package-xyz is not installed" in str(e.value)


def test_mil_builder_writes_a_package(tmp_path):
    """An ANE-layout op chain (1x1 conv, layer_norm over channels) in (B, C, 1, S)
    builds and saves with fp16 weights; the package has the expected files."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 8, 1, 1)).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 1, 16))], opset_version=ct.target.macOS15)
    def prog(x):
        y = mb.conv(x=x, weight=w)
        return mb.layer_norm(x=y, axes=[1], epsilon=1e-5, name="out")

    model = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.macOS15,
        compute_precision=ct.precision.FLOAT16,
    )
    path = tmp_path / "t.mlpackage"
    model.save(str(path))
    manifest = json.loads((path / "Manifest.json").read_text())
    assert manifest["itemInfoEntries"], manifest
    assert (path / "Data" / "com.apple.CoreML" / "model.mlmodel").is_file()
    spec = model.get_spec()
    assert [o.name for o in spec.description.output] == ["out"]
    assert list(spec.description.output[0].type.multiArrayType.shape) == [1, 4, 1, 16]
    assert os.path.getsize(path / "Data" / "com.apple.CoreML" / "model.mlmodel") > 0


def _import_stderr(code):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return r.stderr


@pytest.mark.skipif(os.uname().sysname == "Darwin", reason="the bindings load on macOS")
def test_coremltools_import_is_quiet_off_macos():
    """Importing coremltools without its macOS bindings warns once per proxy
    class; after `import ane_export` those lines are gone, and only those."""
    loud = _import_stderr("import coremltools")
    assert loud.count("Failed to load _ML") >= 4, loud
    quiet = _import_stderr(
        "import ane_export, logging, coremltools\n"
        "import coremltools.models.ml_program.experimental.compute_plan_utils\n"
        "logging.getLogger('coremltools').warning('Failed to load _MLModelProxy: disk on fire')\n"
        "logging.getLogger('coremltools').error('Failed to load _MLModelProxy: libcoremlpython')\n"
        "logging.getLogger('coremltools.converters').warning('another warning')\n"
    )
    assert quiet.splitlines() == [
        "Failed to load _MLModelProxy: disk on fire",
        "Failed to load _MLModelProxy: libcoremlpython",
        "another warning",
    ], quiet


def test_quiet_coremltools_only_off_macos():
    from ane_export import quiet_coremltools

    assert quiet_coremltools("darwin") is False
    assert quiet_coremltools("linux") is True
