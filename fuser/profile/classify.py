"""What each GPU activity is (its category) and what it moved or computed.

The category comes from, in order: the optimizer step around it; memcpy/memset; fuser's
kernel table (a fused kernel, or a copy when it does no arithmetic); the innermost ATen op
that launched it (GEMM, attention, copies/fills, else unfused memory-bound); an Inductor
kernel's name (its ops); and last the kernel's name alone (a trace with no CPU events).
Bytes of an ATen op come from its input shapes (torch.profiler's record_shapes): inputs
read once, the output written once. FLOPs of GEMMs and attention come from the same shapes.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import torch

from fuser.profile.events import Activity, CpuEvent

GEMM = "GEMM"
ATTENTION = "attention"
FUSED = "fused memory-bound"
UNFUSED = "unfused memory-bound"
COPIES = "copies/fills"
OPTIMIZER = "optimizer"
OTHER = "other"
IDLE = "idle"
CATEGORIES = (GEMM, ATTENTION, FUSED, UNFUSED, COPIES, OPTIMIZER, OTHER)

# dense bf16 tensor-core peaks, FLOP/s (NVIDIA datasheets; sparsity not counted). Keyed by
# a substring of torch.cuda.get_device_name(); the first match wins, so the more specific
# names come first.
PEAK_BF16 = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
)

GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "_int_mm", "mv"}
GEMM_OPS |= {"addmv", "addbmm", "convolution", "_convolution", "cudnn_convolution"}
COPY_OPS = {"copy_", "fill_", "zero_", "clone", "contiguous", "_to_copy", "cat", "stack"}
COPY_OPS |= {"zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros"}
COPY_OPS |= {"constant_pad_nd", "narrow_copy", "_unsafe_view", "index_copy_"}
OPTIMIZER_OPS = ("_fused_adam", "_fused_sgd", "_foreach_", "_fused_adagrad")
REDUCE_OPS = {"sum", "mean", "amax", "amin", "max", "min", "norm", "var_mean", "prod", "argmax"}
REDUCE_OPS |= {"argmin", "any", "all", "std", "var", "logsumexp", "linalg_vector_norm"}
# ops whose kernels read their inputs and write one output of the broadcast shape
POINTWISE_OPS = {
    "add", "sub", "mul", "div", "neg", "exp", "log", "tanh", "sigmoid", "relu", "gelu",
    "gelu_backward", "silu", "silu_backward", "where", "pow", "rsqrt", "sqrt", "abs",
    "maximum", "minimum", "threshold_backward", "addcmul", "addcdiv", "lerp", "erf",
    "masked_fill", "eq", "ne", "lt", "le", "gt", "ge", "reciprocal", "sin", "cos",
    "native_dropout", "native_dropout_backward", "tanh_backward", "sigmoid_backward",
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    "native_layer_norm", "native_layer_norm_backward", "nll_loss_forward",
    "nll_loss_backward", "rsub", "clamp", "clamp_min", "logical_not", "bitwise_not",
}  # fmt: skip
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::complex<float>": 8,
}  # fmt: skip
# tensor lists carry no dtype in the trace: an optimizer's are taken as float32 (its
# parameters and state under autocast), a cat's from its kernel (OpaqueType<bytes>)
OPTIMIZER_LIST_BYTES = 4
OPAQUE = re.compile(r"OpaqueType<(\d+)")

GEMM_NAME = re.compile(r"nvjet|gemm|cutlass|xmma|cublas|splitKreduce|s16816|wgmma_", re.I)
ATTN_NAME = re.compile(r"flash|fmha|attention|sdpa|(^|_)attn_|dot_do_o|convert_dq", re.I)
COPY_NAME = re.compile(r"copy|Fill|Memcpy|Memset|CatArray|zero_", re.I)
OPT_NAME = re.compile(r"multi_tensor_apply|adam|FusedSgd", re.I)
INDUCTOR_NAME = re.compile(r"^triton_(poi|red|per|for|tem|mix|unk)_fused_(.*?)(_\d+)?$")

# ops that only move, view or fill data (an Inductor kernel of these alone is a copy) and
# ops that name a GEMM an Inductor kernel was generated around (its prologue/epilogue)
MOVEMENT_OPS = {
    "view", "_unsafe_view", "reshape", "expand", "t", "transpose", "permute", "clone",
    "slice", "select", "unsqueeze", "squeeze", "cat", "split", "split_with_sizes",
    "_to_copy", "copy", "copy_", "as_strided", "alias", "detach", "zeros", "zeros_like",
    "full", "full_like", "fill", "fill_", "new_zeros", "new_empty", "empty", "stack",
    "constant_pad_nd", "unbind", "lift_fresh_copy", "arange", "iota", "ones", "ones_like",
    "squeeze_copy", "unsqueeze_copy", "view_copy", "permute_copy", "expand_copy",
    "slice_scatter", "select_scatter", "index_select", "embedding", "scalar_tensor",
}  # fmt: skip
NEUTRAL_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "native_dropout"}
# Inductor's kernel names carry ATen ops; fuser's regions carry their decompositions
EXPANSIONS = {
    "_log_softmax": {"amax", "sub", "exp", "sum", "log"},
    "_log_softmax_backward_data": {"exp", "sum", "mul", "sub"},
    "_softmax": {"amax", "sub", "exp", "sum", "div"},
    "_softmax_backward_data": {"mul", "sum", "sub"},
    "prepare_softmax_online": {"amax", "sub", "exp", "sum"},  # Inductor's online softmax
}
# op names in Inductor's kernel names that are not ATen's
INDUCTOR_VOCABULARY = {"prepare_softmax_online"}


def peak_flops(device: str) -> tuple[float | None, str]:
    """(dense bf16 FLOP/s, the table entry it came from) for a device name."""
    for key, flops in PEAK_BF16:
        if key.lower() in device.lower():
            return flops, key
    return None, ""


def base_name(op: str) -> str:
    """aten::add_.Tensor -> add_ ; add.Tensor -> add"""
    return op.removeprefix("aten::").split(".")[0]


@functools.cache
def _aten_vocabulary() -> frozenset[str]:
    names = torch._C._dispatch_get_all_op_names()
    aten = {base_name(n) for n in names if n.startswith("aten::")}
    return frozenset(aten | INDUCTOR_VOCABULARY)


def inductor_ops(kernel: str) -> list[str] | None:
    """The ATen ops an Inductor kernel name lists (triton_per_fused_add_native_layer_norm_3
    -> [add, native_layer_norm]); None when the name is not Inductor's."""
    m = INDUCTOR_NAME.match(kernel)
    if m is None:
        return None
    vocab, parts, out, i = _aten_vocabulary(), m.group(2).split("_"), [], 0
    while i < len(parts):
        for j in range(len(parts), i, -1):  # the longest run of parts that names an op
            word = "_".join(parts[i:j])
            if word in vocab and word:
                out.append(word)
                i = j
                break
        else:
            if parts[i]:
                out.append(parts[i])
            i += 1
    return out


def op_set(ops: list[str]) -> frozenset[str]:
    """The ops that do work, for comparing a fused region with an Inductor kernel."""
    out: set[str] = set()
    for op in ops:
        b = base_name(op).rstrip("_") if op != "_" else op
        if b in MOVEMENT_OPS or b in NEUTRAL_OPS or not b:
            continue
        out |= EXPANSIONS.get(b, {b.removesuffix("_default").removesuffix(".default")})
    return frozenset(out)


def category(a: Activity, fused: dict | None) -> str:
    """The category of one activity; `fused` is fuser's entry for its kernel, if any."""
    names = [e.name for e in a.ancestors]
    if any(n.startswith("Optimizer.step") for n in names) or OPT_NAME.search(a.name):
        return OPTIMIZER
    if any(base_name(n).startswith(OPTIMIZER_OPS) for n in names if n.startswith("aten::")):
        return OPTIMIZER
    op = a.innermost()
    if a.kind in ("memcpy", "memset"):
        # cuBLAS zeroes a split-K workspace inside aten::mm: the GEMM's time, not a copy
        return _owner(op) or COPIES
    if fused is not None:
        return COPIES if fused.get("copy_only") else FUSED
    if FUSER_CASTS.match(a.name):
        return COPIES  # fuser's cast groups: casts, as Inductor's _to_copy kernels are copies
    if FUSER_KERNELS.match(a.name):
        return FUSED  # fuser's kernels outside fused regions (scatter-adds, the CE scale)
    owner = _owner(op)
    if owner is not None:
        return owner
    ops = inductor_ops(a.name)
    if ops is not None:
        if a.name.startswith("triton_tem_") and {"mm", "addmm", "bmm"} & set(ops):
            return GEMM
        return COPIES if not op_set(ops) else FUSED
    if op is not None:
        return COPIES if base_name(op.name) in COPY_OPS else UNFUSED
    return _by_name(a.name)


def generated(a: Activity, fused: dict | None) -> bool:
    """Whether the compiler wrote this kernel: a fuser region's, one fuser launches
    outside regions, or one of Inductor's (its kernel names list the ops it fused)."""
    if a.kind in ("memcpy", "memset"):
        return False
    if fused is not None or FUSER_CASTS.match(a.name) or FUSER_KERNELS.match(a.name):
        return True
    return inductor_ops(a.name) is not None and not a.name.startswith("triton_tem_")


# The CPU events that enclose whatever a compiled graph runs: Dynamo's mark around a
# compiled frame (forward) and the autograd node of AOTAutograd's compiled backward.
# Dynamo's mark spans the whole frame, so an unsupported call that a frame with a graph
# break runs eagerly between its graphs counts as inside: the figure is a lower bound.
COMPILED_MARKS = ("Torch-Compiled Region", "autograd::engine::evaluate_function: Compiled")


def in_compiled_graph(a: Activity) -> bool | None:
    """Whether a compiled graph launched this activity; None where nothing launched it
    that the profile knows of (a kernel with no CPU events, e.g. no twin in the
    attributes pass). An activity outside every graph ran eagerly: code Dynamo did not
    capture (a graph break, a frame past its recompile limit) or outside the model."""
    if not a.ancestors:
        return None
    return any(e.name.startswith(COMPILED_MARKS) for e in a.ancestors)


# kernels fuser launches outside a fused region (no region entry): its cast groups
# (runtime/cast_group.py), scatter-adds (codegen/triton/scatter.py) and the in-place
# scale of a cross-entropy gradient (dynamo/ce_scale.py)
FUSER_CASTS = re.compile(r"^cast_group_\d+$")
FUSER_KERNELS = re.compile(r"^(scatter_(sorted|table|finalize|atomic)|_scale_rows)$")


def _owner(op: CpuEvent | None) -> str | None:
    """GEMM or ATTENTION where `op`, the innermost ATen op enclosing an activity, is one."""
    if op is None:
        return None
    b = base_name(op.name)
    if b in GEMM_OPS:
        return GEMM
    if "attention" in b or "scaled_dot_product" in b:
        return ATTENTION
    return None


def _by_name(name: str) -> str:
    if GEMM_NAME.search(name):
        return GEMM
    if ATTN_NAME.search(name):
        return ATTENTION
    if COPY_NAME.search(name):
        return COPIES
    if re.search(r"elementwise|reduce|softmax|norm|embedding|index|scatter|gather", name, re.I):
        return UNFUSED
    return OTHER


# -- bytes and FLOPs from shapes -------------------------------------------------------


def _numel(shape: Any) -> int:
    return math.prod(int(d) for d in shape) if isinstance(shape, list) else 0


def _is_list(dims: Any) -> bool:
    return isinstance(dims, list) and bool(dims) and all(isinstance(d, list) for d in dims)


def tensors(op: CpuEvent, list_bytes: int | None = None) -> list[tuple[list[int], int]] | None:
    """(shape, bytes per element) of each tensor argument, tensor lists flattened (None
    when a tensor list's element size is not known)."""
    dims, types = op.args.get("Input Dims", []), op.args.get("Input type", [])
    out = []
    for d, t in zip(dims, types):
        if t == "TensorList" or _is_list(d):
            if list_bytes is None:
                return None
            out += [(s, list_bytes) for s in d if isinstance(s, list)]
        elif t in DTYPE_BYTES and isinstance(d, list):
            out.append((d, DTYPE_BYTES[t]))
    return out


def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, start=rank - len(s)):
            out[i] = max(out[i], int(d))
    return out


def op_bytes(op: CpuEvent, kernel: str = "") -> int | None:
    """Minimal bytes of an ATen op from its recorded input shapes, or None if unknown;
    `kernel` (a kernel's name) may tell the element size of a tensor list."""
    b = base_name(op.name)
    m = OPAQUE.search(kernel)
    list_bytes = int(m.group(1)) if m else None
    if b.startswith(OPTIMIZER_OPS):
        list_bytes = OPTIMIZER_LIST_BYTES
    ts = tensors(op, list_bytes)
    if not ts:
        return None
    size = [_numel(s) * n for s, n in ts]
    if b in ("fill_", "zero_"):
        return size[0]
    if b == "copy_":
        return sum(size[:2])
    if b in ("cat", "stack"):
        return 2 * sum(size)
    if b.startswith("_fused_adam"):  # params, grads, exp_avgs, exp_avg_sqs: 3 read+written
        n = len(op.args.get("Input Dims", [[]])[0])
        p, g, m, v = (sum(size[i * n : (i + 1) * n]) for i in range(4))
        return 2 * (p + m + v) + g
    if b.startswith("_foreach_"):  # reads every list, writes the first (or a new one)
        n = len(op.args.get("Input Dims", [[]])[0])
        return sum(size) + sum(size[:n])
    if b in REDUCE_OPS:
        return sum(size)
    if b.rstrip("_") in POINTWISE_OPS:
        out = _numel(_broadcast([s for s, _ in ts])) * ts[0][1]
        return sum(size) + (0 if b.endswith("_") else out)
    return None


_ATTN_Q = ("query", "q")
_MM_OPERANDS = {
    "mm": ("self", "mat2"),
    "addmm": ("mat1", "mat2"),
    "bmm": ("self", "mat2"),
    "baddbmm": ("batch1", "batch2"),
    "matmul": ("self", "other"),
    "_scaled_mm": ("self", "mat2"),
}


@functools.cache
def _arg_names(op: str) -> tuple[str, ...]:
    try:
        schemas = torch._C._jit_get_schemas_for_operator(op.split(".")[0])
    except RuntimeError:
        return ()
    return tuple(a.name for a in schemas[0].arguments) if schemas else ()


def op_flops(op: CpuEvent) -> int | None:
    """FLOPs of a GEMM (2·M·N·K) or of attention (forward 4·B·H·Tq·Tk·D, halved when
    causal; backward 2.5x the forward, FlashAttention's count with the recomputation)."""
    b = base_name(op.name)
    dims = op.args.get("Input Dims", [])
    names = _arg_names(op.name)
    if b in _MM_OPERANDS:
        a_name, b_name = _MM_OPERANDS[b]
        if a_name not in names or b_name not in names:
            return None
        x, y = dims[names.index(a_name)], dims[names.index(b_name)]
        if not (isinstance(x, list) and isinstance(y, list) and len(x) >= 2 and len(y) >= 2):
            return None
        batch = math.prod(x[:-2]) if len(x) > 2 else 1
        return 2 * batch * x[-2] * x[-1] * y[-1]
    if "attention" not in b:
        return None
    qi = next((names.index(n) for n in _ATTN_Q if n in names), None)
    ki = names.index("key") if "key" in names else None
    if qi is None or ki is None or len(dims) <= max(qi, ki):
        return None
    q, k = dims[qi], dims[ki]
    if not (isinstance(q, list) and isinstance(k, list) and len(q) == 4 and len(k) == 4):
        return None
    bsz, heads, tq, d = q
    flops = 4 * bsz * heads * tq * k[2] * d
    if _causal(op, names):
        flops //= 2
    return int(flops * 2.5) if "backward" in b else flops


def _causal(op: CpuEvent, names: tuple[str, ...]) -> bool:
    concrete = op.args.get("Concrete Inputs", [])
    for key, yes in (("is_causal", ("True", "1", "true")), ("custom_mask_type", ("1", "2"))):
        if key in names and names.index(key) < len(concrete):
            return concrete[names.index(key)] in yes
    return False


def activity_bytes(a: Activity) -> tuple[int | None, str]:
    """(bytes, where from) for an activity that is not one of fuser's kernels."""
    if a.kind == "memset" and a.nbytes is not None:
        return int(a.nbytes), "memset"
    if a.kind == "memcpy" and a.nbytes is not None:
        return 2 * int(a.nbytes), "memcpy (read + write)"
    inner = a.ancestors[-1] if a.ancestors else None
    if inner is not None and inner.name == a.name:  # Inductor's record of its kernel
        if "kernel_num_gb" in inner.args:
            return int(float(inner.args["kernel_num_gb"]) * 1e9), "Inductor's estimate"
        ts = tensors(inner)
        return (sum(_numel(s) * n for s, n in ts), "kernel arguments") if ts else (None, "")
    op = a.innermost()
    if op is None:
        return None, ""
    nbytes = op_bytes(op, a.name)
    return (nbytes, "op shapes") if nbytes is not None else (None, "")
