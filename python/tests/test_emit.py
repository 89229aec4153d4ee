"""Emission's shortcuts around coremltools change no byte of a package, and a
package's specification has the same bytes from one build to the next."""

import contextlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ane_export import emit
from ane_export.qwen3_vl import save_packages

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_qwen3_vl import tiny  # noqa: E402

SPEC = "Data/com.apple.CoreML/model.mlmodel"
WEIGHTS = "Data/com.apple.CoreML/weights/weight.bin"
#: Several keys, so that an order of the metadata map drawn per process shows.
META = {"author": "ane-export tests", "user": {f"key_{i}": str(i) for i in range(12)}}


def pairs():
    """(a, b) pairs for `allclose`: equal, close, far, NaN, infinities, zeros, dtypes."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal(1000).astype(np.float16)
    nan = a.copy()
    nan[7] = np.nan
    inf = a.copy()
    inf[3] = np.inf
    minf = inf.copy()
    minf[3] = -np.inf
    sub = a.copy()
    sub[5] = np.float16(6e-8)
    zero = a.copy()
    zero[5] = 0
    neg = zero.copy()
    neg[5] = -0.0
    far = a.copy()
    far[9] += np.float16(0.5)
    return [(a, a.copy()), (nan, nan.copy()), (inf, inf.copy()), (inf, minf), (sub, zero), (zero, neg),
            (a, far), (a.astype(np.float32), a.astype(np.float32)), (np.int32(4), np.int32(4)),
            (np.arange(6, dtype=np.int32), np.arange(6, dtype=np.int32)[::-1])]


@pytest.mark.parametrize("atol", [6e-8, 1e-12])
def test_bytes_first_allclose_is_numpys(atol):
    fast = emit._BytesFirst(np)
    got = [fast.allclose(a, b, rtol=0.0, atol=atol) for a, b in pairs()]
    want = [bool(np.allclose(a, b, rtol=0.0, atol=atol)) for a, b in pairs()]
    assert got == want
    # The pairs reach both answers, NaN's included.
    assert True in got and False in got and got[1] is False


def package_bytes(path):
    return {f: (Path(path) / f).read_bytes() for f in (SPEC, WEIGHTS)}


def test_merge_shortcuts_change_no_byte(tmp_path, monkeypatch):
    """Without revalidation and with the bytes-first comparison, the package
    is the one coremltools' own validation and comparison give."""
    spec, w = tiny()
    fast = tmp_path / "fast.mlpackage"
    save_packages(spec, w, [("b16", 16), ("b32", 32)], str(fast), metadata=META)
    monkeypatch.setattr(emit, "_no_revalidation", contextlib.nullcontext)
    monkeypatch.setattr(emit, "_bytes_first_const_comparison", contextlib.nullcontext)
    slow = tmp_path / "slow.mlpackage"
    save_packages(spec, w, [("b16", 16), ("b32", 32)], str(slow), metadata=META)
    assert package_bytes(fast) == package_bytes(slow)


def test_lowered_programs_make_the_package_converted_ones_make(tmp_path, monkeypatch):
    """A multifunction build merges lowered programs (`lower`: nothing
    serialized); merging the programs of fully converted models instead
    (`convert`, each bucket written to a package of its own) gives the same
    bytes."""
    spec, w = tiny()
    fast = tmp_path / "lowered.mlpackage"
    calls = []
    real = emit.lower

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(emit, "lower", counted)
    save_packages(spec, w, [("b16", 16), ("b32", 32)], str(fast), metadata=META)
    assert len(calls) == 2, "the build did not lower the buckets' programs: the test compares nothing"
    monkeypatch.setattr(emit, "lower", lambda prog, target: emit.convert(prog, target)._mil_program)
    slow = tmp_path / "converted.mlpackage"
    save_packages(spec, w, [("b16", 16), ("b32", 32)], str(slow), metadata=META)
    assert package_bytes(fast) == package_bytes(slow)


def test_revalidation_is_restored():
    from coremltools.converters.mil.mil.program import Program

    before = Program.validate
    with emit._no_revalidation():
        assert Program.validate is not before
    assert Program.validate is before


SAVE = """
import sys
sys.path.insert(0, {tests!r})
from test_emit import META
from test_qwen3_vl import tiny
from ane_export.qwen3_vl import save_packages
spec, w = tiny()
save_packages(spec, w, [("b16", 16), ("b32", 32)], {out!r}, metadata=META)
"""


def test_the_specification_has_the_same_bytes_in_another_process(tmp_path):
    """Two builds in two processes write the same `model.mlmodel` (protobuf
    orders a map's entries differently per process unless told not to)."""
    outs = [tmp_path / f"p{i}.mlpackage" for i in range(2)]
    tests = str(Path(__file__).resolve().parent)
    for out in outs:
        subprocess.run([sys.executable, "-c", SAVE.format(tests=tests, out=str(out))], check=True,
                       cwd=str(Path(__file__).resolve().parents[1]))
    assert package_bytes(outs[0]) == package_bytes(outs[1])


@pytest.mark.parametrize("multifunction,mode", [(True, "fp16"), (False, "int8")])
def test_no_temporary_package_is_left_behind(tmp_path, monkeypatch, multifunction, mode):
    """coremltools' temporary packages (converted, compressed, merged) are
    gone when `save_packages` returns, not at the interpreter's exit, which
    Python embedded in `ane-export` never reaches."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    spec, w = tiny()
    out = tmp_path / ("m.mlpackage" if multifunction else "dir")
    out.mkdir(exist_ok=True) if not multifunction else None
    seen = []
    # Multifunction: the merged package exists once the merge returns; per bucket: once converted.
    hook = "_set_metadata" if multifunction else "compress"
    real = getattr(emit, hook)

    def spy(*args, **kwargs):
        # coremltools' packages are being written into the scratch directory.
        seen.extend(p.name for p in scratch.rglob("*.mlpackage"))
        return real(*args, **kwargs)

    monkeypatch.setattr(emit, hook, spy)
    save_packages(spec, w, [("b16", 16), ("b32", 32)], str(out), multifunction=multifunction, metadata=META,
                  target="macOS15", weights_mode=mode)
    assert seen, "the spy saw no temporary package: the test checks nothing"
    assert list(scratch.iterdir()) == []


def test_no_temporary_package_is_left_behind_on_failure(tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def fail(*args, **kwargs):
        assert list(scratch.rglob("*.mlpackage")), "no temporary package was written before the failure"
        raise RuntimeError("metadata failed")

    # After the merge, which wrote the merged package.
    monkeypatch.setattr(emit, "_set_metadata", fail)
    spec, w = tiny()
    with pytest.raises(RuntimeError, match="metadata failed"):
        save_packages(spec, w, [("b16", 16), ("b32", 32)], str(tmp_path / "m.mlpackage"), metadata=META)
    assert list(scratch.iterdir()) == []


def test_a_writer_error_on_a_full_disk_says_so(tmp_path, monkeypatch):
    """coremltools' weight writer reports a full disk without a cause; with
    less room than the weights where it writes, the error says "No space"."""
    import errno
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    writer = RuntimeError("[MIL FileWriter]: Unknown error occurred while writing data to the file.")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(OSError) as e:
        emit._raise_if_no_space(writer, str(tmp_path), 5000)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path) and e.value.__cause__ is writer
    # Room enough: the error is not this function's to replace.
    emit._raise_if_no_space(writer, str(tmp_path), 500)
    # Already a full-disk error: left as it is.
    emit._raise_if_no_space(OSError(errno.ENOSPC, "full"), str(tmp_path), 5000)
