"""Errors raised by fuser. Every message names the op, the operand and what was expected."""


class FuserError(Exception):
    """Base class of every error fuser raises on bad input."""


class ShapeError(FuserError):
    """Operand shapes do not fit the op."""


class DTypeError(FuserError):
    """Operand dtypes do not fit the op."""


class DefinitionError(FuserError):
    """The fusion definition itself is malformed (undefined value, missing output, ...)."""


class InputError(FuserError):
    """Tensors passed to execute() do not match the definition."""


class VerificationError(FuserError):
    """A graph failed verification after a pass."""


class ScheduleError(FuserError):
    """A schedule is illegal (for example a vector width that does not divide the row)."""


class CompileError(FuserError):
    """Generated source failed to compile; the message carries the source and the log."""


class OutOfBoundsError(FuserError, IndexError):
    """An index-like input holds a value outside its range (a cross-entropy target not in
    [0, classes) and not ignore_index). An IndexError too, as PyTorch's own "Target 16 is
    out of bounds."; the message names the element and the valid range."""
