"""The package version, in a module of its own: the on-disk cache keys on it, and
importing it must not import the whole package (fuser/__init__ imports the frontend,
the runtime and the torch.compile backend)."""

__version__ = "0.1.0"
