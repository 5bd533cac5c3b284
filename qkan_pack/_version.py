"""The single source of the package version (pyproject reads it too)."""

__version__ = "0.1.0"
