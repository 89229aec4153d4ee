"""Deliberate defects for the gates' own tests (`ane-export build --fault`),
as rewrites of a finished program.

A family's builder emits the production program only; `apply` rewrites it,
finding the ops by the names the shared layers give them (`vit.py`: the
patch embedding `patch_embed`, `b{i}_res1`, `b{i}_heads`, `*_masked`, a
merge's `*_perm` then `*_rows`). Each fault must make one gate fail:

- swap-rb: red and blue swapped in the patch embedding (the artifact sees BGR);
- no-mask: every attention mask ignored;
- gather: an identity gather after the embedding (leaves the ANE, R8);
- overflow: block 1's (or, with one block, block 0's) residual stream
  scaled by 65536 and back after its attention (exact in fp32, inf in fp16).

Subtle ones, which the cosine gate must reject:

- swap-heads: heads 0 and 1 exchanged before the output projection in every block;
- ln-eps: every LayerNorm's epsilon 10x too large (RMSNorms are LayerNorms
  here, `vit.rms_norm_of`);
- merge-order: each 2x2 merge group read in transposed order;
- int8-axis: square 1x1 convs stored in int8 with per-output-channel scales
  applied along the input channels.

(The host-side faults, rope-theta and pos-align, are in the manifest's host
recipe: Rust writes them.) A fault that finds nothing to rewrite is an
error, so that a gate test cannot pass against an unbroken artifact.
"""

import re

import numpy as np

from .vit import LN_EPS, _f16

FAULTS = ("swap-rb", "no-mask", "gather", "overflow", "swap-heads", "ln-eps", "merge-order", "int8-axis")


def check(faults):
    """The faults asked for, or ValueError naming the unknown ones."""
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"faults {sorted(unknown)}: expected some of {', '.join(FAULTS)}")


def apply(prog, faults):
    """Rewrite `prog` (a MIL program, every function) with `faults`, in place."""
    check(faults)
    for fault in faults:
        for fn in prog.functions.values():
            if not _REWRITES[fault](fn):
                raise ValueError(f"fault {fault}: found nothing to rewrite in the program")
    return prog


def _mb():
    from coremltools.converters.mil import Builder as mb

    return mb


def _ops(block, op_type=None, name=None):
    """The block's ops of `op_type` whose names match the regex `name`, in order."""
    return [op for op in list(block.operations)
            if (op_type is None or op.op_type == op_type) and (name is None or re.fullmatch(name, op.name))]


def _after(block, op):
    """The op after `op` in the block: new ops go before it."""
    ops = list(block.operations)
    return ops[ops.index(op) + 1]


def _redirect(block, old, new):
    """Every use of `old` after the op making `new` reads `new` instead."""
    block.replace_uses_of_var_after_op(anchor_op=new.op, old_var=old, new_var=new)


def _replace(block, op, new):
    """`op` replaced by the op making `new` (inserted before it), which takes its name."""
    _redirect(block, op.outputs[0], new)
    block.remove_ops([op])
    new.op.name = new.name = op.name


def _swap_rb(fn):
    """The patch embedding's input channels are (c, py, px): its red and blue blocks exchanged."""
    mb = _mb()
    for conv in _ops(fn, "conv", "patch_embed"):
        w = conv.weight.val
        k = w.shape[1] // 3
        with fn:
            new = mb.const(val=np.concatenate([w[:, 2 * k:], w[:, k:2 * k], w[:, :k]], axis=1),
                           name="patch_embed_weight_swap_rb", before_op=conv)
        fn.replace_uses_of_var_after_op(anchor_op=new.op, old_var=conv.weight, new_var=new, end_op=conv)
        return True
    return False


def _no_mask(fn):
    """Each `*_masked` add (scores + mask) replaced by its scores."""
    masked = _ops(fn, "add", r".*_masked")
    for op in masked:
        fn.replace_uses_of_var_after_op(anchor_op=op, old_var=op.outputs[0], new_var=op.x)
    fn.remove_ops(masked)
    return bool(masked)


def _gather(fn):
    """An identity gather over the sequence after the embedding (`embed`, else `patch_embed`)."""
    mb = _mb()
    anchor = (_ops(fn, name="embed") or _ops(fn, "conv", "patch_embed") or [None])[0]
    if anchor is None:
        return False
    x = anchor.outputs[0]
    with fn:
        g = mb.gather(x=x, indices=np.arange(x.shape[3], dtype=np.int32), axis=3, name="embed_gather",
                      before_op=_after(fn, anchor))
    _redirect(fn, x, g)
    return True


def _overflow(fn):
    """Block 1's (or the only block's) residual stream after attention scaled by 256, 256, 1/256, 1/256."""
    mb = _mb()
    res = {int(re.match(r"b(\d+)_res1$", op.name).group(1)): op for op in _ops(fn, "add", r"b\d+_res1")}
    if not res:
        return False
    i = 1 if len(res) > 1 else 0
    op = res[i]
    old = y = op.outputs[0]
    before = _after(fn, op)
    with fn:
        for j, f in enumerate((256.0, 256.0, 1 / 256.0, 1 / 256.0)):
            y = mb.mul(x=y, y=_f16(f), name=f"b{i}_boost{j}", before_op=before)
    fn.replace_uses_of_var_after_op(anchor_op=y.op, old_var=old, new_var=y)
    return True


def _swap_heads(fn):
    """The first two heads of every block's `b{i}_heads` concat exchanged."""
    mb = _mb()
    done = False
    for op in _ops(fn, "concat", r"b\d+_heads"):
        values = list(op.values)
        if len(values) < 2:
            continue
        values[0], values[1] = values[1], values[0]
        with fn:
            new = mb.concat(values=values, axis=op.axis.val, name=op.name + "_swapped", before_op=op)
        _replace(fn, op, new)
        done = True
    return done


def _ln_eps(fn):
    """Every layer_norm's epsilon times 10 (rounded to fp16 from the unrounded
    value when it is the builders' `LN_EPS`)."""
    mb = _mb()
    norms = _ops(fn, "layer_norm")
    for op in norms:
        eps = float(op.epsilon.val)
        eps = _f16(LN_EPS * 10 if _f16(LN_EPS) == _f16(eps) else eps * 10)
        with fn:
            new = mb.layer_norm(x=op.x, axes=op.axes, gamma=op.gamma, beta=op.beta, epsilon=eps,
                                name=op.name + "_eps10", before_op=op)
        _replace(fn, op, new)
    return bool(norms)


def _merge_order(fn):
    """Each merge's four tokens (`*_perm`, (1, 4, D, N/4), feeding `*_rows`)
    read in the order (0, 2, 1, 3): the 2x2 group column-major."""
    mb = _mb()
    done = False
    for op in _ops(fn, "transpose", r".*_perm"):
        name = op.name[: -len("_perm")]
        y = op.outputs[0]
        if not any(c.name == name + "_rows" for c in y.child_ops):
            continue
        _, four, dim, m = y.shape
        before = _after(fn, op)
        with fn:
            parts = [mb.slice_by_index(x=y, begin=[0, j, 0, 0], end=[1, j + 1, dim, m], name=f"{name}_g{j}",
                                       before_op=before) for j in range(four)]
            t = mb.concat(values=[parts[0], parts[2], parts[1], parts[3]], axis=1, name=name + "_transposed",
                          before_op=before)
        _redirect(fn, y, t)
        done = True
    return done


def _int8_axis(fn):
    """Each square 1x1 conv weight [C, C, 1, 1] quantised to int8 with one
    scale per output channel (as R14 wants), the scales stored along the
    input-channel axis: dequantisation multiplies column c by row c's scale
    (iOS18 `constexpr_blockwise_shift_scale`)."""
    mb = _mb()
    done = False
    for conv in _ops(fn, "conv"):
        v = conv.weight.val if conv.weight.op.op_type == "const" else None
        if v is None or not (v.ndim == 4 and v.shape[0] == v.shape[1] and v.shape[2:] == (1, 1)):
            continue
        w = v.astype(np.float32)
        scale = np.maximum(np.abs(w).max(axis=(1, 2, 3)), 1e-8) / 127.0
        q = np.clip(np.round(w / scale[:, None, None, None]), -127, 127).astype(np.int8)
        with fn:
            new = mb.constexpr_blockwise_shift_scale(data=q, scale=scale.astype(np.float16).reshape(1, -1, 1, 1),
                                                     name=conv.name + "_weight_int8_wrong_axis", before_op=conv)
        fn.replace_uses_of_var_after_op(anchor_op=new.op, old_var=conv.weight, new_var=new, end_op=conv)
        done = True
    return done


_REWRITES = {
    "swap-rb": _swap_rb,
    "no-mask": _no_mask,
    "gather": _gather,
    "overflow": _overflow,
    "swap-heads": _swap_heads,
    "ln-eps": _ln_eps,
    "merge-order": _merge_order,
    "int8-axis": _int8_axis,
}
