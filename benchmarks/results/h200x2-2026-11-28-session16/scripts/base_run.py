"""Run a module (argv[1], its arguments after) with session 15's fuser from .gpu/base
instead of the editable install: the install's import finder goes first, so PYTHONPATH
alone does not reach it."""
import os, runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "base"))
import fuser  # noqa: E402
print("fuser from", fuser.__file__, file=sys.stderr)
mod = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
