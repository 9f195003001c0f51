"""fuser: a fusion code generator for NVIDIA GPUs (Triton and CUDA C++ backends)."""

from fuser import config as _config  # noqa: F401  (reads the environment first)
from fuser.dynamo import FuserBackend, Trace, explain, trace  # noqa: E402
from fuser.dynamo import register as _register_backend  # noqa: E402
from fuser.errors import FuserError, OutOfBoundsError
from fuser.frontend.fusion_definition import FusionDefinition
from fuser.runtime.checks import check_errors
from fuser.version import __version__  # noqa: F401

_register_backend()  # torch.compile(model, backend="fuser")

from fuser.profile import profile  # noqa: E402  (fuser.profile(step): where a step's time goes)

__all__ = [
    "FuserBackend",
    "FuserError",
    "FusionDefinition",
    "OutOfBoundsError",
    "Trace",
    "check_errors",
    "explain",
    "profile",
    "trace",
]
