"""Bad input of every kind gives a FuserError subclass whose message names the op, the
operand and what was expected."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fuser import FuserError, FusionDefinition
from fuser.errors import DefinitionError, DTypeError, InputError, ShapeError, VerificationError
from fuser.ir.dtypes import DType
from fuser.ir.graph import Graph, Node, Value
from fuser.ir.ops import Op
from fuser.ir.verify import verify

F16, F32, I64 = torch.float16, torch.float32, torch.int64


def define(*specs: tuple[list[int], torch.dtype]) -> tuple[FusionDefinition, list]:
    """An open FusionDefinition and its input handles (no `with`: it stays unfinalized)."""
    fd = FusionDefinition()
    return fd, [fd.define_tensor(shape, dtype) for shape, dtype in specs]


def expect(fn: Callable[[], object], error: type[FuserError], *words: str) -> str:
    assert issubclass(error, FuserError)
    with pytest.raises(error) as info:
        fn()
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"message lacks {missing}: {message!r}"
    return message


# -- definition time: dtypes -------------------------------------------------------------
def _bad_where():
    fd, (c, a, b) = define(([4], F32), ([4], F32), ([4], F32))
    return fd.ops.where(c, a, b)


def _ce_float_target():
    fd, (logits, target) = define(([4, 10], F32), ([4], F32))
    return fd.ops.cross_entropy(logits, target)


def _ce_int_logits():
    fd, (logits, target) = define(([4, 10], I64), ([4], I64))
    return fd.ops.cross_entropy(logits, target)


def _layer_norm_int():
    fd, (x,) = define(([4, 10], torch.int32))
    return fd.ops.layer_norm(x)


def _mean_int():
    fd, (x,) = define(([4, 10], I64))
    return fd.ops.mean(x, dims=[1])


def _sub_bool():
    fd, (a, b) = define(([4], torch.bool), ([4], torch.bool))
    return fd.ops.sub(a, b)


def _floor_int():
    fd, (x,) = define(([4], I64))
    return fd.ops.floor(x)


def _exp_bool():
    fd, (x,) = define(([4], torch.bool))
    return fd.ops.exp(x)


def _unsupported_dtype():
    fd = FusionDefinition()
    return fd.define_tensor([4], torch.complex64)


DTYPE_ERRORS = {
    "where-float-condition": (_bad_where, DTypeError, ["where", "t0", "float32", "bool"]),
    "cross_entropy-float-target": (
        _ce_float_target,
        DTypeError,
        ["cross_entropy", "target t1", "float32", "int64"],
    ),
    "cross_entropy-int-logits": (_ce_int_logits, DTypeError, ["cross_entropy", "t0", "float"]),
    "layer_norm-int": (_layer_norm_int, DTypeError, ["layer_norm", "t0", "int32", "float"]),
    "mean-int": (_mean_int, DTypeError, ["mean", "t0", "int64", "float"]),
    "sub-bool": (_sub_bool, DTypeError, ["sub", "bool", "numbers"]),
    "floor-int": (_floor_int, DTypeError, ["floor", "t0", "int64", "float"]),
    "exp-bool": (_exp_bool, DTypeError, ["exp", "t0", "bool", "number"]),
    "define_tensor-complex": (_unsupported_dtype, DTypeError, ["complex64", "float32"]),
}


# -- definition time: shapes -------------------------------------------------------------
def _add_mismatch():
    fd, (a, b) = define(([4, 5], F32), ([4, 6], F32))
    return fd.ops.add(a, b)


def _bcast(shape: list, dims: list, src: list = (4,)) -> Callable:
    def fn():
        fd, (x,) = define((list(src), F32))
        return fd.ops.broadcast_in_dim(x, shape=shape, broadcast_dims=dims)

    return fn


def _sum_bad_dim():
    fd, (x,) = define(([4, 5], F32))
    return fd.ops.sum(x, dims=[2])


def _sum_repeated_dim():
    fd, (x,) = define(([4, 5], F32))
    return fd.ops.sum(x, dims=[1, -1])


def _softmax_bad_dim():
    fd, (x,) = define(([4, 5], F32))
    return fd.ops.softmax(x, dim=-3)


def _layer_norm_weight():
    fd, (x, w) = define(([4, 5], F32), ([6], F32))
    return fd.ops.layer_norm(x, weight=w)


def _ce_rows():
    fd, (logits, target) = define(([4, 10], F32), ([3], I64))
    return fd.ops.cross_entropy(logits, target)


def _ce_rank():
    fd, (logits, target) = define(([2, 4, 10], F32), ([2], I64))
    return fd.ops.cross_entropy(logits, target)


def _where_mismatch():
    fd, (c, a, b) = define(([4, 5], torch.bool), ([4, 5], F32), ([4, 6], F32))
    return fd.ops.where(c, a, b)


def _iota_dim():
    return FusionDefinition().ops.iota([4, 5], dim=2)


def _bad_size():
    return FusionDefinition().define_tensor([4, -2])


SHAPE_ERRORS = {
    "add-[4,5]-[4,6]": (_add_mismatch, ShapeError, ["add", "t0", "[4, 5]", "t1", "[4, 6]"]),
    "where-[4,5]-[4,6]": (_where_mismatch, ShapeError, ["where", "[4, 5]", "[4, 6]"]),
    "broadcast-rank": (_bcast([3, 4], [0, 1]), ShapeError, ["broadcast_in_dim", "t0", "rank 1"]),
    "broadcast-dim-range": (
        _bcast([3, 4], [2]),
        ShapeError,
        ["broadcast_in_dim", "[2]", "output rank 2", "t0"],
    ),
    "broadcast-dims-order": (
        _bcast([4, 4, 4], [1, 0], (4, 4)),
        ShapeError,
        ["broadcast_in_dim", "increasing"],
    ),
    "broadcast-size": (
        _bcast([3, 5], [1]),
        ShapeError,
        ["broadcast_in_dim", "t0", "size 4", "expected 1 or 5"],
    ),
    "sum-dim-range": (_sum_bad_dim, ShapeError, ["sum", "dim 2", "t0", "rank 2"]),
    "sum-dim-repeated": (_sum_repeated_dim, ShapeError, ["sum", "repeated", "t0"]),
    "softmax-dim-range": (_softmax_bad_dim, ShapeError, ["softmax", "dim -3", "t0"]),
    "layer_norm-weight": (
        _layer_norm_weight,
        ShapeError,
        ["layer_norm", "parameter t1", "[6]", "expected [5]"],
    ),
    "cross_entropy-rows": (
        _ce_rows,
        ShapeError,
        ["cross_entropy", "target t1", "[3]", "expected [4]"],
    ),
    "cross_entropy-rank": (_ce_rank, ShapeError, ["cross_entropy", "logits t0", "rank 3"]),
    "iota-dim": (_iota_dim, ShapeError, ["iota", "dim 2", "[4, 5]"]),
    "define_tensor-size": (_bad_size, DefinitionError, ["define_tensor", "-2", "dim 1"]),
}


# -- definition time: the definition itself ----------------------------------------------
def _foreign_operand():
    _, (other,) = define(([4], F32))
    fd, (x,) = define(([4], F32))
    return fd.ops.add(x, other)


def _foreign_unary():
    _, (other,) = define(([4], F32))
    fd, _ = define(([4], F32))
    return fd.ops.exp(other)


def _torch_operand():
    fd, (x,) = define(([4], F32))
    return fd.ops.mul(x, torch.ones(4))


def _string_operand():
    fd, (x,) = define(([4], F32))
    return fd.ops.add(x, "1")


def _no_outputs():
    with FusionDefinition() as fd:
        fd.define_tensor([4])


def _input_as_output():
    with FusionDefinition() as fd:
        fd.add_output(fd.define_tensor([4]))


def _foreign_output():
    _, (other,) = define(([4], F32))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.define_tensor([4])))
        fd.add_output(other)


def _finalized() -> tuple[FusionDefinition, object]:
    with FusionDefinition("done") as fd:
        x = fd.define_tensor([4])
        fd.add_output(fd.ops.exp(x))
    return fd, x


def _op_after_finalize():
    fd, x = _finalized()
    return fd.ops.neg(x)


def _operator_after_finalize():
    fd, x = _finalized()
    return x + 1.0


def _define_after_finalize():
    fd, _ = _finalized()
    return fd.define_tensor([4])


def _output_after_finalize():
    fd, x = _finalized()
    return fd.add_output(x)


def _scalar_not_number():
    return FusionDefinition().define_scalar("2.0")


def _reduce_without_dims():
    fd, (x,) = define(([4, 5], F32))
    return fd.ops.sum(x)


def _bad_gelu():
    fd, (x,) = define(([4], F32))
    return fd.ops.gelu(x, approximate="fast")


def _unknown_op():
    return FusionDefinition().ops.matmul


def _unknown_layout_arg():
    return FusionDefinition().define_tensor([4], F32, strides=[1])


DEFINITION_ERRORS = {
    "operand-from-another-fd": (
        _foreign_operand,
        DefinitionError,
        ["add", "operand 1", "t0", "another FusionDefinition"],
    ),
    "unary-operand-from-another-fd": (
        _foreign_unary,
        DefinitionError,
        ["exp", "operand 0", "another FusionDefinition"],
    ),
    "torch-tensor-operand": (
        _torch_operand,
        DefinitionError,
        ["mul", "operand 1", "Tensor", "fuser Tensor"],
    ),
    "string-operand": (_string_operand, DefinitionError, ["add", "operand 1", "str", "number"]),
    "no-outputs": (_no_outputs, DefinitionError, ["no outputs", "add_output"]),
    "input-as-output": (_input_as_output, DefinitionError, ["add_output", "t0", "input"]),
    "output-from-another-fd": (
        _foreign_output,
        DefinitionError,
        ["add_output", "t0", "not a tensor of this"],
    ),
    "op-after-finalize": (_op_after_finalize, DefinitionError, ["neg", "finalized", "with"]),
    "operator-after-finalize": (_operator_after_finalize, DefinitionError, ["finalized"]),
    "define-after-finalize": (
        _define_after_finalize,
        DefinitionError,
        ["done", "finalized", "with"],
    ),
    "output-after-finalize": (_output_after_finalize, DefinitionError, ["finalized"]),
    "define_scalar-string": (_scalar_not_number, DefinitionError, ["define_scalar", "'2.0'"]),
    "sum-without-dims": (_reduce_without_dims, DefinitionError, ["sum", "dims"]),
    "gelu-approximate": (_bad_gelu, DefinitionError, ["gelu", "'fast'", "'tanh'"]),
    "define_tensor-unknown-arg": (_unknown_layout_arg, DefinitionError, ["strides"]),
}

ALL = {**DTYPE_ERRORS, **SHAPE_ERRORS, **DEFINITION_ERRORS}


@pytest.mark.parametrize("fn,error,words", ALL.values(), ids=ALL.keys())
def test_definition_errors(fn, error, words) -> None:
    expect(fn, error, *words)


def test_unknown_op_is_an_attribute_error_naming_it() -> None:
    # stays an AttributeError so hasattr(fd.ops, name) works
    with pytest.raises(AttributeError, match="matmul"):
        _unknown_op()


# -- execute time: fd.bind / fd.reference -------------------------------------------------
def _fd_rows() -> FusionDefinition:
    with FusionDefinition("rows") as fd:
        x = fd.define_tensor([-1, 8], F16)
        v = fd.define_tensor([-1], F16)
        fd.add_output(fd.ops.add(x, fd.ops.broadcast_in_dim(v, shape=x.shape, broadcast_dims=[1])))
    return fd


def _x(*shape: int, dtype=F16) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)


INPUT_ERRORS = {
    "too-few": ([_x(3, 8)], ["rows", "2 inputs", "got 1"]),
    "too-many": ([_x(3, 8), _x(8), _x(8)], ["2 inputs", "got 3"]),
    "wrong-dtype": ([_x(3, 8, dtype=F32), _x(8)], ["input 0", "t0", "torch.float32", "float16"]),
    "unsupported-dtype": ([_x(3, 8), _x(8).to(torch.uint8)], ["input 1", "t1", "uint8"]),
    "wrong-rank": ([_x(3, 8), _x(1, 8)], ["input 1", "t1", "rank 2", "expected rank 1"]),
    "static-size": ([_x(3, 9), _x(9)], ["input 0", "t0", "size 9", "dim 1", "expected 8"]),
    "not-a-tensor": ([_x(3, 8), [1.0] * 8], ["input 1", "t1", "list", "not a tensor"]),
    "several-devices": (
        [_x(3, 8), _x(8).to("meta")],
        ["input 1", "t1", "meta", "cpu", "one device"],
    ),
}


@pytest.mark.parametrize("inputs,words", INPUT_ERRORS.values(), ids=INPUT_ERRORS.keys())
@pytest.mark.parametrize("entry", ["bind", "reference"])
def test_input_errors(entry: str, inputs: list, words: list[str]) -> None:
    fd = _fd_rows()
    expect(lambda: getattr(fd, entry)(inputs), InputError, *words)


def test_inputs_must_be_a_sequence() -> None:
    fd = _fd_rows()
    expect(lambda: fd.reference(_x(3, 8)), InputError, "list of tensors", "tensor of shape [3, 8]")


@pytest.mark.parametrize("vector_first", [True, False], ids=["v+x", "x+v"])
def test_symbolic_sizes_that_conflict_name_the_node(vector_first: bool) -> None:
    with FusionDefinition() as fd:
        v = fd.define_tensor([-1], F32)
        x = fd.define_tensor([-1, -1], F32)
        # [H] + [rows, H]: only the vector is broadcast, whichever side it is on
        fd.add_output(fd.ops.add(v, x) if vector_first else fd.ops.add(x, v))
    assert [n.op for n in fd.graph.nodes] == [Op.BROADCAST_IN_DIM, Op.ADD]
    ok = fd.reference([_x(5, dtype=F32), _x(3, 5, dtype=F32)])[0]
    assert ok.shape == (3, 5)
    # a size-1 vector still broadcasts, as in torch
    assert fd.reference([_x(1, dtype=F32), _x(3, 5, dtype=F32)])[0].shape == (3, 5)
    message = expect(
        lambda: fd.bind([_x(4, dtype=F32), _x(3, 5, dtype=F32)]),
        VerificationError,
        "broadcast_in_dim(t0)",
        "t0",
        "size 4",
        "expected 1 or 5",
    )
    assert message.startswith("[definition+concrete] node `t2 = broadcast_in_dim(t0)`")


def test_symbolic_sizes_that_conflict_between_operands_of_one_rank() -> None:
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], F32)
        b = fd.define_tensor([-1, -1], F32)
        fd.add_output(fd.ops.mul(a, b))
    # -1 sizes may turn out to be 1, so b is broadcast to a's sizes; that node reports it
    expect(
        lambda: fd.reference([_x(3, 5, dtype=F32), _x(3, 6, dtype=F32)]),
        VerificationError,
        "`t2 = broadcast_in_dim(t1)`",
        "t1",
        "size 6",
        "expected 1 or 5",
    )


def test_symbolic_size_conflict_with_a_parameter() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], F16)
        w = fd.define_tensor([-1], F16)
        fd.add_output(fd.ops.layer_norm(x, weight=w))
    expect(
        lambda: fd.reference([_x(3, 5), _x(6)]),
        VerificationError,
        "layer_norm(t0, t1)",
        "parameter t1",
        "[6]",
        "expected [5]",
    )


# -- the verifier on hand-built graphs ----------------------------------------------------
X = Value(0, (4, 5), DType.float32)
Y = Value(1, (4, 5), DType.float32)


def _exp(inp: Value, out: Value) -> Node:
    return Node(Op.EXP, (inp,), (out,))


BAD_GRAPHS = {
    "undefined-input": (
        Graph((X,), (_exp(Value(7, (4, 5), DType.float32), Y),), (Y,)),
        ["`t1 = exp(t7)`", "uses t7", "not defined"],
    ),
    "used-before-defined": (
        Graph(
            (X,),
            (_exp(Y, Value(2, (4, 5), DType.float32)), _exp(X, Y)),
            (Value(2, (4, 5), DType.float32),),
        ),
        ["`t2 = exp(t1)`", "uses t1", "not defined before"],
    ),
    "wrong-output-dtype": (
        Graph(
            (X,), (_exp(X, Value(1, (4, 5), DType.float16)),), (Value(1, (4, 5), DType.float16),)
        ),
        ["`t1 = exp(t0)`", "output t1", "float16", "expected float32"],
    ),
    "wrong-output-shape": (
        Graph(
            (X,), (_exp(X, Value(1, (5, 4), DType.float32)),), (Value(1, (5, 4), DType.float32),)
        ),
        ["`t1 = exp(t0)`", "output t1", "[5, 4]", "expected float32[4, 5]"],
    ),
    "output-never-computed": (
        Graph((X,), (_exp(X, Y),), (Value(9, (4, 5), DType.float32),)),
        ["output t9", "never computed"],
    ),
    "redefined": (
        Graph((X,), (_exp(X, Y), _exp(Y, Y)), (Y,)),
        ["`t1 = exp(t1)`", "redefines t1"],
    ),
    "output-count": (
        Graph((X,), (Node(Op.EXP, (X,), (Y, Value(2, (4, 5), DType.float32))),), (Y,)),
        ["exp(t0)", "2 outputs", "expected 1"],
    ),
    "operand-count": (
        Graph((X,), (Node(Op.ADD, (X,), (Y,)),), (Y,)),
        ["`t1 = add(t0)`", "expected 2 operands", "got 1"],
    ),
    "bad-operand-dtype": (
        Graph(
            (X,),
            (Node(Op.WHERE, (X, X, X), (Y,)),),
            (Y,),
            origin="my_pass",
        ),
        ["[my_pass]", "`t1 = where(t0, t0, t0)`", "condition t0", "expected bool"],
    ),
}


@pytest.mark.parametrize("graph,words", BAD_GRAPHS.values(), ids=BAD_GRAPHS.keys())
def test_verifier_names_the_node(graph: Graph, words: list[str]) -> None:
    expect(lambda: verify(graph), VerificationError, *words)


def test_verifier_accepts_what_it_should() -> None:
    good = Graph((X,), (_exp(X, Y),), (Y,))
    assert verify(good) is good
    # an input may be an output after passes remove every node in between
    assert verify(Graph((X,), (), (X,))).outputs == (X,)
