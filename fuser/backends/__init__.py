"""Backends as objects: each renders a KernelPlan, compiles and launches its source,
estimates the registers a plan costs and states its limits. `fuser/backends/registry.py`
is the one place that knows them by name; a third backend is one more Backend subclass
registered there."""
