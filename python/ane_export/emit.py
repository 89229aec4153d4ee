"""Generic emission: a family's MIL programs to saved Core ML packages.

A family module (`ane_export.<family>`, chosen by the Rust side's family
registry) builds one MIL program per bucket (`build_program`) and says what
its functions take and return (`describe`, `input_shapes`,
`output_names`); this module converts each program to an ML program,
compresses its weights (`compress`), merges the buckets into one
multifunction package or saves one package per bucket, and checks what it
saved (`save_packages`). Nothing here knows a family's maths. Test faults
(`faults.py`) are rewrites of each finished program, before conversion.
"""

import contextlib
import logging
from unittest.mock import patch

import numpy as np

from .faults import apply as apply_faults
from .faults import check as check_faults

#: Deployment targets a package may have; multifunction packages need macOS 15.
TARGETS = ("macOS14", "macOS15")
#: Weight storage: fp16, int8 per-channel (R14), or k-means palettes of 6 or 8 bits (R14).
WEIGHT_MODES = ("fp16", "int8", "pal6", "pal8")


def compress(model, mode, keep=()):
    """Compress a converted model's weights with coremltools' optimisation API.

    keep: names of consts left as they are (a family's `UNCOMPRESSED`:
    tables computed by the builder, such as rotary cos/sin, which a
    per-channel int8 scale or a palette would round far beyond fp16).

    int8: symmetric linear quantisation with per-channel scales (per-block
    scales fall off the ANE, R14). pal6/pal8: k-means palettes per tensor;
    tensors under 10,000 elements are left in fp16 (for them coremltools
    would need scikit-learn, and they hold little of the weight)."""
    import coremltools.optimize.coreml as cto

    if mode == "fp16":
        return model
    with _no_program_dumps():
        return _compress(model, mode, cto, keep)


def _compress(model, mode, cto, keep=()):
    present = {op.name for f in model._mil_program.functions.values() for op in f.operations}
    kept = {name: None for name in keep if name in present}  # None: not compressed
    if mode == "int8":
        op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                         weight_threshold=2048)
        return cto.linear_quantize_weights(model, cto.OptimizationConfig(global_config=op, op_name_configs=kept))
    if mode in ("pal6", "pal8"):
        op = cto.OpPalettizerConfig(nbits=int(mode[3:]), mode="kmeans", granularity="per_tensor",
                                    weight_threshold=10_000)
        return cto.palettize_weights(model, cto.OptimizationConfig(global_config=op, op_name_configs=kept))
    raise ValueError(f"weights mode {mode!r}: expected one of {', '.join(WEIGHT_MODES)}")


def to_fp16(weights):
    """The weights as fp16 arrays (rounded to nearest, as the fp16 cast pass
    rounds); arrays already in fp16 are kept, so a dict converted once serves
    every bucket without a second copy."""
    return {k: v if v.dtype == np.float16 else v.astype(np.float16) for k, v in weights.items()}


#: The graph passes a bucket's program goes through before coremltools'
#: backend passes: only dead-code elimination (a fault build such as
#: `no-mask` leaves the mask's slices unused). The program is emitted in
#: fp16, with nothing to fuse, fold or reorder, so coremltools' default
#: pipeline (95 passes, each followed by a validation of the whole program)
#: returns the same dataflow graph (a test checks it) at the cost of minutes
#: on a 2B tower. Passes left out of this list are also left out of the
#: backend's list; the backend's own lowering passes still run.
CONVERT_PASSES = ("common::dead_code_elimination",)


@contextlib.contextmanager
def _no_program_dumps():
    """While converting: the program's text is not formatted for nothing.

    coremltools' pass pipeline logs the whole program before and after each
    of its three pipelines with `logger.debug(f"...{prog}")`; the f-string
    formats the program even when debug logging is off. Merging a 2B tower's
    two functions took 38.5 s with the text formatted and 32.5 s without
    (the conversions themselves did not measurably change). Unless the
    "coremltools" logger is at DEBUG, the text is replaced by a note while
    the block runs."""
    from coremltools.converters.mil.mil.program import Program

    if logging.getLogger("coremltools").isEnabledFor(logging.DEBUG):
        yield
        return
    with patch.object(Program, "__str__",
                      lambda self: "<program text not formatted: coremltools' DEBUG logging is off>"):
        yield


@contextlib.contextmanager
def _no_revalidation():
    """While converting or merging: the program is not validated again.

    coremltools validates the whole program before each of its three
    pipelines and after every pass of them, even of a pass it skips: ten
    validations of a bucket's program, and as many of the merged one, most
    of the conversion's and of the merge's time on a 2B tower. `convert`
    validates the program it is given once, before it converts; what the
    passes make of it is checked where it matters, in the saved bytes
    (`_check_saved`, and the gates, whose interpreter runs them). The
    merge changes no op of either function (it sets which consts share a
    blob), so validating the union checks nothing new."""
    from coremltools.converters.mil.mil.program import Program

    with patch.object(Program, "validate", lambda self, *args, **kwargs: None):
        yield


class _BytesFirst:
    """numpy, as coremltools' const deduplication sees it, with an
    `allclose` that first compares the arrays' bytes.

    Equal bytes (and no NaN) mean `allclose` is true, whatever the
    tolerances: every difference is 0 and equal infinities are close. Only
    arrays whose bytes differ go through numpy's `allclose`, so the pass
    finds the same duplicates; it compared every pair of equal weights of
    two buckets element by element, in temporaries of their size."""

    def __init__(self, np_module):
        self._np = np_module

    def __getattr__(self, name):
        return getattr(self._np, name)

    def allclose(self, a, b, *args, **kwargs):
        a, b = self._np.asarray(a), self._np.asarray(b)
        if (a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
                and not (a.dtype.kind in "fc" and self._np.isnan(a).any())):
            return True
        return self._np.allclose(a, b, *args, **kwargs)


@contextlib.contextmanager
def _bytes_first_const_comparison():
    """While the merge deduplicates consts: [`_BytesFirst`]'s `allclose`."""
    import importlib

    # The module (the package exports the pass class under the same name).
    cd = importlib.import_module("coremltools.converters.mil.mil.passes.defs.cleanup.const_deduplication")
    with patch.object(cd, "np", _BytesFirst(cd.np)):
        yield


def convert(prog, target="macOS15", passes=CONVERT_PASSES):
    """Convert a bucket's fp16 program to an ML program model (not loaded).

    `passes=None` runs coremltools' default pipeline instead (the program is
    already fp16, so its fp16 cast pass finds nothing to do)."""
    import coremltools as ct

    pipeline = ct.PassPipeline() if passes is None else ct.PassPipeline(list(passes), "ane-export")
    prog.validate()
    with _no_program_dumps(), _no_revalidation():
        return ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, target),
                          compute_precision=ct.precision.FLOAT32, pass_pipeline=pipeline, skip_model_load=True)


def lower(prog, target="macOS15", passes=CONVERT_PASSES):
    """What `convert` makes of a bucket's fp16 program, short of serializing
    it: the conversion's passes, then coremltools' backend passes for an ML
    program. The multifunction build merges these programs and serializes
    the merged one alone (`convert` writes each bucket's weights to a
    package of its own first, which the merge never reads)."""
    import coremltools as ct
    from coremltools.converters.mil.converter import _construct_other_pipelines
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager

    pipeline = ct.PassPipeline(list(passes), "ane-export")
    prog.validate()
    with _no_program_dumps(), _no_revalidation():
        prog = ct.convert(prog, convert_to="milinternal", minimum_deployment_target=getattr(ct.target, target),
                          compute_precision=ct.precision.FLOAT32, pass_pipeline=pipeline)
        # `convert_to="milinternal"` stops before the backend's passes, which `convert` runs next.
        _, backend = _construct_other_pipelines(pipeline, "milinternal", "mlprogram")
        PassPipelineManager.apply_pipeline(prog, backend)
        prog._check_early_error_out_for_invalid_program()
    return prog


def save_packages(family, spec, weights, buckets, path, multifunction=True, metadata=None, target="macOS15",
                  weights_mode="fp16", faults=(), query_chunk=None, scratch=None):
    """Convert one program per bucket ((name, patches) pairs), compress its
    weights (`weights_mode`) and save.

    multifunction: one package at `path` with a function per bucket (weights
    stored once, macOS 15+); else one package per bucket, `path` being a
    directory that receives `<bucket>.mlpackage`. Returns the written paths.
    scratch: where coremltools' temporary packages go (in a directory of
    their own, removed on return); `None`, the system's temporary directory.
    """
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: expected one of {', '.join(TARGETS)}")
    if multifunction and target != "macOS15":
        raise ValueError("multifunction packages need macOS 15; build one package per bucket for older targets")
    check_faults(faults)
    weights = to_fp16(weights)
    with _scratch_directory(scratch) as d:
        try:
            return _save_packages(family, spec, weights, buckets, path, multifunction, metadata or {}, target,
                                  weights_mode, faults, query_chunk)
        except Exception as e:
            _raise_if_no_space(e, d, sum(v.nbytes for v in weights.values()))
            raise


def _raise_if_no_space(error, scratch, need):
    """An error raised while the scratch directory's filesystem has less room
    than the weights becomes `OSError(ENOSPC)` naming the directory.

    coremltools' weight writer reports a full disk as "Unknown error occurred
    while writing data to the file", naming neither the file nor the cause."""
    import errno
    import shutil

    free = shutil.disk_usage(scratch).free
    if free < need and not (isinstance(error, OSError) and error.errno == errno.ENOSPC):
        raise OSError(errno.ENOSPC, f"No space left on device: {free / 1e6:.1f} MB free where the temporary "
                                    f"packages are written, each needs the weights' {need / 1e6:.1f} MB "
                                    f"({error})", scratch) from error


@contextlib.contextmanager
def _scratch_directory(parent=None):
    """While emitting: Python's temporary files go to a directory of their
    own, made in `parent` (`None`: the one `TMPDIR` names) and removed when
    the block ends, however it ends.

    coremltools writes every converted, compressed or merged model to a
    temporary package (a bucket's weights each time: gigabytes for a 2B
    tower) and removes them at exit through `atexit`. Python embedded in
    `ane-export` never runs its exit handlers, so every build left its
    packages in the system's temporary directory (three per multifunction
    build). The build passes its staging directory as `parent`, so that
    what a killed build leaves is cleaned up with the rest of its staging
    directory by the next build."""
    import tempfile

    with (tempfile.TemporaryDirectory(prefix="ane-export-emit-", dir=parent) as d,
          patch.object(tempfile, "tempdir", d)):
        yield d


def _save_packages(family, spec, weights, buckets, path, multifunction, metadata, target, weights_mode, faults,
                   query_chunk):
    import os

    stage = _Stages()
    weights = to_fp16(weights)
    programs, out = {}, []
    for name, patches in buckets:
        with stage(f"{name}: build program"):
            prog = family.build_program(spec, weights, patches, target,
                                        family.QUERY_CHUNK if query_chunk is None else query_chunk)
            if faults:
                apply_faults(prog, faults)
        if multifunction and weights_mode == "fp16":
            # Merged before anything is serialized.
            with stage(f"{name}: lower"):
                programs[name] = lower(prog, target)
            continue
        with stage(f"{name}: convert"):
            m = convert(prog, target)
        with stage(f"{name}: compress ({weights_mode})"):
            m = compress(m, weights_mode, getattr(family, "UNCOMPRESSED", ()))
        if multifunction:
            programs[name] = m._mil_program
            continue
        _describe(m._spec.description, family.describe(spec, patches))
        _set_metadata(m, metadata)
        p = os.path.join(path, f"{name}.mlpackage")
        with stage(f"{name}: save"):
            m.save(p)
            _serialize_deterministically(p)
        with stage(f"{name}: check"):
            _check_saved(family, p, {"main": patches}, spec, metadata)
        out.append(p)
    if not multifunction:
        return out
    with stage("merge functions"):
        m = _merge_functions(programs, default=buckets[0][0])
    del programs
    for fd in m._spec.description.functions:
        _describe(fd, family.describe(spec, dict(buckets)[fd.name]))
    _set_metadata(m, metadata)
    with stage("save"):
        m.save(path)
        _serialize_deterministically(path)
    with stage("check"):
        _check_saved(family, path, dict(buckets), spec, metadata)
    return [path]


def _serialize_deterministically(path):
    """Write a saved package's specification again with protobuf's
    deterministic serialization, so that one build's `model.mlmodel` has the
    same bytes as the next's.

    coremltools serializes it as protobuf does by default, which writes a
    map's entries (the metadata's `userDefined`) in an order drawn anew in
    each process. (The package's `Manifest.json` still names its items by
    identifiers drawn at random.)"""
    import os

    from coremltools.proto import Model_pb2

    f = os.path.join(path, "Data", "com.apple.CoreML", "model.mlmodel")
    with open(f, "rb") as fh:
        spec = Model_pb2.Model.FromString(fh.read())
    tmp = f + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(spec.SerializeToString(deterministic=True))
    os.replace(tmp, f)


class _Stages:
    """With ANE_EXPORT_PROFILE=1, each stage's seconds on stderr."""

    def __init__(self):
        import os

        self.on = os.environ.get("ANE_EXPORT_PROFILE") == "1"

    def __call__(self, name):
        import contextlib
        import sys
        import time

        @contextlib.contextmanager
        def timed():
            t = time.perf_counter()
            yield
            if self.on:
                print(f"profile: emission {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)

        return timed()


def _describe(desc, text):
    """Write what each input and output holds into a model description (Xcode shows it)."""
    for feature in list(desc.input) + list(desc.output):
        feature.shortDescription = text.get(feature.name, "")


def _set_metadata(m, metadata):
    m.author = metadata.get("author", "")
    m.license = metadata.get("license", "")
    m.version = metadata.get("version", "")
    m.short_description = metadata.get("description", "")
    for k, v in metadata.get("user", {}).items():
        m.user_defined_metadata[k] = str(v)


def _merge_functions(programs, default):
    """One multifunction model with each bucket's program (lowered, or taken
    from its converted model) as the function named after the bucket,
    identical weights stored once. Each function's inputs and outputs are
    described as coremltools describes a converted program's.

    This is what `coremltools.utils.save_multifunction` does, without its
    round trip through disk: that saves every bucket's package, parses each
    back into a program with all its weights, and lowers the merged program
    through a pipeline whose passes it skips but whose validation of the whole
    program after every pass it does not, several minutes on a 2B tower. Here
    the programs are merged and serialized once, with no passes (each
    function went through its conversion's passes)."""
    import coremltools as ct
    from coremltools.converters.mil.converter import mil_convert
    from coremltools.converters.mil.mil import Program
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    merged = Program()
    for name, prog in programs.items():
        merged.add_function(name, prog.functions["main"])
    # Consts with equal values in two functions point at one blob of the weight file.
    with _bytes_first_const_comparison():
        PASS_REGISTRY["common::const_deduplication"]._deduplicate_const_across_functions(merged)
    merged.default_function_name = default
    merged.skip_all_passes = True
    merged.export_as_multifunction = True
    with _no_program_dumps(), _no_revalidation():
        # Multifunction packages need specification 9 (iOS 18, macOS 15).
        return mil_convert(merged, convert_to="mlprogram", convert_from="milinternal",
                           specification_version=ct._SPECIFICATION_VERSION_IOS_18,
                           compute_units=ct.ComputeUnit.CPU_ONLY, skip_model_load=True,
                           pass_pipeline=ct.PassPipeline.EMPTY)


def _check_saved(family, path, functions, spec, metadata):
    """Reload a saved package's specification with coremltools and check that
    each function takes and returns what its bucket must (static shapes), that
    every input and output is described and that the metadata is there."""
    import coremltools as ct

    model = ct.utils.load_spec(path)
    meta = model.description.metadata
    want_meta = {k: str(v) for k, v in metadata.get("user", {}).items()}
    if meta.author != metadata.get("author", "") or any(meta.userDefined.get(k) != v for k, v in want_meta.items()):
        raise RuntimeError(f"{path}: metadata (author {meta.author!r}, user {dict(meta.userDefined)}) "
                           f"is not what was written ({metadata})")
    descs = [model.description] if not model.description.functions else list(model.description.functions)
    for fd in descs:
        blank = [f.name for f in list(fd.input) + list(fd.output) if not f.shortDescription]
        if blank:
            raise RuntimeError(f"{path}: function {fd.name or 'main'}: no description for {blank}")
    prog = model.mlProgram
    if sorted(prog.functions.keys()) != sorted(functions):
        raise RuntimeError(f"{path}: functions {sorted(prog.functions.keys())}, expected {sorted(functions)}")
    for name, n in functions.items():
        f = prog.functions[name]
        got = {i.name: [x.constant.size for x in i.type.tensorType.dimensions] for i in f.inputs}
        want = dict(family.input_shapes(spec, n))
        if got != want:
            raise RuntimeError(f"{path}: function {name} inputs {got}, expected {want}")
        outs = list(f.block_specializations[f.opset].outputs)
        want_outs = family.output_names(spec)
        if outs != want_outs:
            raise RuntimeError(f"{path}: function {name} outputs {outs}, expected {want_outs}")
