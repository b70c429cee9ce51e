"""The package version, in a module of its own: anything may import it without loading the package's API."""

__version__ = "0.1.0"
