"""kiln's version, in its own module: caches key on it; no stage imports the package root."""

__version__ = "0.1.0"
