"""torch.compile integration: the "fuser" backend, `trace` and `explain`.

model = torch.compile(model, backend="fuser")
fuser.explain(model)          # after the first call (and the first backward)
t = fuser.trace(model, x)     # capture, compile forward and backward, inspect
"""

from fuser.dynamo.backend import CAPTURES, Capture, FuserBackend, fuser_backend, register
from fuser.dynamo.explain import explain
from fuser.dynamo.trace import Trace, trace

__all__ = [
    "CAPTURES",
    "Capture",
    "FuserBackend",
    "Trace",
    "explain",
    "fuser_backend",
    "register",
    "trace",
]
