"""Core ML on a Mac: prediction with the Neural Engine and MLComputePlan.

Everything that calls Core ML needs macOS (coremltools' `libcoremlpython`).
The Rust side runs this module in a child process,

    python -m ane_export.coreml predict PKG FUNCTION IN.safetensors OUT.safetensors [--compute-units U]
    python -m ane_export.coreml plan PKG FUNCTION OUT.json [--compute-units U]

so that a Neural Engine compile failure that kills the process on its first
prediction (ANE-RULES R18) cannot take the caller down. Tensors travel as
safetensors files (f32 or f16); the plan as JSON: one row per operation,
nested blocks included, with the device Core ML prefers and the estimated
cost weight. Predictions are *measured* on the Mac that ran them; the plan is
Core ML's own (its preferred device and estimated cost per operation), not a
measurement of where a run placed each op.

For many predictions (`ane-run embed`, `bench`, the gates) the Rust side
keeps one child running,

    python -m ane_export.coreml serve PKG [--compute-units U]

which loads each function's model on its first request and keeps it: one
request per line on stdin, `{"function": F, "inputs": IN, "out": OUT}`, one
reply per line, `{"ok": true, "load_s": .., "predict_s": .., "pid": ..,
"loaded": true}` or `{"ok": false, "error": "..", "loaded": ..}`, where
`loaded` says whether the function's model is loaded after the request
(the caller allows a longer wait for a request that has to load it). Replies go to the original stdout; anything
else written to stdout (by Python or by Core ML's libraries) is sent to
stderr so it cannot break the protocol. A crash ends the child, and the
caller sees the end of its replies.
"""

from __future__ import annotations

import json
import struct
import sys

#: Compute units accepted by --compute-units (coremltools' names).
COMPUTE_UNITS = ("CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU", "ALL")

_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2)}


def read_safetensors(path):
    """Read a safetensors file of f32/f16 tensors into f32 numpy arrays. The
    file is mapped, not read whole: each tensor is copied out once."""
    import os

    import numpy as np

    if os.path.getsize(path) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (n,) = struct.unpack("<Q", data[:8].tobytes())
    if n > len(data) - 8:
        raise ValueError(f"{path}: header of {n} bytes runs past the end")
    header = json.loads(data[8:8 + n].tobytes())
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor `{name}` has dtype {t['dtype']}, expected F32 or F16")
        dt, size = _DTYPES[t["dtype"]]
        a, b = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if not (0 <= a <= b <= len(body)) or b - a != count * size:
            raise ValueError(f"{path}: tensor `{name}` has offsets {a}..{b} for shape {t['shape']}")
        out[name] = body[a:b].view(dt).reshape(t["shape"]).astype(np.float32)
    return out


def write_safetensors(path, tensors):
    """Write f32 numpy arrays as a safetensors file."""
    import numpy as np

    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        chunks.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def require_macos():
    if sys.platform != "darwin":
        raise RuntimeError(f"Core ML prediction and MLComputePlan need macOS; this is {sys.platform}")


def _units(name):
    import coremltools as ct

    if name not in COMPUTE_UNITS:
        raise ValueError(f"compute units {name!r}: expected one of {', '.join(COMPUTE_UNITS)}")
    return getattr(ct.ComputeUnit, name)


def _load(pkg, function, units):
    import coremltools as ct

    kwargs = {"compute_units": _units(units)}
    if function != "main":
        kwargs["function_name"] = function
    return ct.models.MLModel(pkg, **kwargs)


def predict(pkg, function, inputs, units="CPU_AND_NE"):
    """Run one function of a package on named inputs; every output as f32."""
    import numpy as np

    require_macos()
    model = _load(pkg, function, units)
    out = model.predict(inputs)
    return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}


def serve(pkg, units, requests, replies, load=None):
    """Answer prediction requests (see the module's doc), one per line of
    `requests`, keeping each function's model loaded; `load(pkg, function,
    units)` loads one (Core ML by default)."""
    import os
    import time

    import numpy as np

    load = load or _load
    models = {}
    for line in requests:
        if not line.strip():
            continue
        t0 = time.perf_counter()
        function = None
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("a request is a JSON object")
            function, inputs, out = req["function"], req["inputs"], req["out"]
            load_s = 0.0
            if function not in models:
                models[function] = load(pkg, function, units)
                load_s = time.perf_counter() - t0
            feed = read_safetensors(inputs)
            t1 = time.perf_counter()
            result = models[function].predict(feed)
            predict_s = time.perf_counter() - t1
            write_safetensors(out, {k: np.asarray(v, dtype=np.float32) for k, v in result.items()})
            reply = {"ok": True, "load_s": load_s, "predict_s": predict_s, "pid": os.getpid(),
                     "loaded": True}
        except Exception as e:  # one bad request does not end the server
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}",
                     "loaded": isinstance(function, str) and function in models}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _serve_main(pkg, units):
    """`serve` on stdin, replying on the original stdout; everything else
    written to fd 1 goes to stderr from here on."""
    import os

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    require_macos()
    _units(units)
    serve(pkg, units, sys.stdin, replies)


def device_name(device):
    """`ane`, `gpu` or `cpu` for a coremltools compute device object."""
    name = type(device).__name__
    return {"MLNeuralEngineComputeDevice": "ane", "MLGPUComputeDevice": "gpu",
            "MLCPUComputeDevice": "cpu"}.get(name, "unknown")


def summarise(plan, block, path=""):
    """One row per operation of `block` and of every nested block, with the
    preferred device, the supported devices and the estimated cost weight."""
    rows = []
    for i, op in enumerate(block.operations):
        usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
        cost = plan.get_estimated_cost_for_mlprogram_operation(op)
        label = op.outputs[0].name if op.outputs else f"{path}op{i}"
        rows.append({
            "op": label,
            "type": op.operator_name,
            "block": path,
            "device": device_name(usage.preferred_compute_device) if usage else "unknown",
            "supported": sorted(device_name(d) for d in usage.supported_compute_devices) if usage else [],
            "cost": float(cost.weight) if cost is not None else 0.0,
        })
        for j, inner in enumerate(op.blocks):
            rows.extend(summarise(plan, inner, f"{path}{label}/{j}/"))
    return rows


def plan(pkg, function, units="CPU_AND_NE"):
    """MLComputePlan of one function: rows as in `summarise`."""
    from coremltools.models.compute_plan import MLComputePlan

    require_macos()
    model = _load(pkg, function, units)
    cp = MLComputePlan.load_from_path(model.get_compiled_model_path(), compute_units=_units(units))
    program = cp.model_structure.program
    if program is None:
        raise ValueError(f"{pkg}: not an ML program")
    functions = program.functions
    if function not in functions:
        if len(functions) != 1:
            raise ValueError(f"{pkg}: no function {function!r} in the compiled model ({', '.join(functions)})")
        function = next(iter(functions))
    return summarise(cp, functions[function].block)


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ane_export.coreml")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("package")
    p.add_argument("function")
    p.add_argument("inputs")
    p.add_argument("out")
    p.add_argument("--compute-units", default="CPU_AND_NE", choices=COMPUTE_UNITS)
    v = sub.add_parser("serve")
    v.add_argument("package")
    v.add_argument("--compute-units", default="CPU_AND_NE", choices=COMPUTE_UNITS)
    q = sub.add_parser("plan")
    q.add_argument("package")
    q.add_argument("function")
    q.add_argument("out")
    q.add_argument("--compute-units", default="CPU_AND_NE", choices=COMPUTE_UNITS)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "serve":
            _serve_main(a.package, a.compute_units)
        elif a.cmd == "predict":
            write_safetensors(a.out, predict(a.package, a.function, read_safetensors(a.inputs), a.compute_units))
        else:
            rows = plan(a.package, a.function, a.compute_units)
            with open(a.out, "w") as f:
                json.dump({"function": a.function, "compute_units": a.compute_units, "operations": rows}, f)
    except Exception as e:  # reported to the Rust side on stderr, exit 2
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
