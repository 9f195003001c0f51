"""fuser: a fusion code generator for NVIDIA GPUs (Triton and CUDA C++ backends)."""

from fuser import config as _config  # noqa: F401  (chooses Triton's mode first)
from fuser.errors import FuserError
from fuser.frontend.fusion_definition import FusionDefinition

__all__ = ["FuserError", "FusionDefinition"]
__version__ = "0.1.0"
