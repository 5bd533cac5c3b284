"""Benchmarks in the product: ``qkan-pack bench`` (side by side in one process, cold starts
in fresh processes), tables, JSON and plots. Uses the runtime's own capture primitives for
its bare-graph baseline; imports nothing of builder or serve (``bench-serve`` starts the server
as a process and drives it over HTTP)."""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._names import LABELS, SKIPPABLE, VARIANTS

if TYPE_CHECKING:
    from ._cold import run_cold_start
    from ._plot import write_plot, write_serve_plot
    from ._render import render_cold_start, render_table, write_json
    from ._results import SCHEMA, BenchReport, BenchSettings, ShapeResult, VariantResult
    from ._serve_load import (
        ServeLoadReport,
        ServeLoadSettings,
        render_serve_load,
        run_serve_load,
        write_serve_json,
    )
    from ._session import CPU_NOTE, run_bench

_LAZY = {
    "run_cold_start": "._cold",
    "render_cold_start": "._render", "render_table": "._render", "write_json": "._render",
    "write_plot": "._plot", "write_serve_plot": "._plot",
    "ServeLoadReport": "._serve_load", "ServeLoadSettings": "._serve_load",
    "render_serve_load": "._serve_load", "run_serve_load": "._serve_load",
    "write_serve_json": "._serve_load",
    "SCHEMA": "._results", "BenchReport": "._results", "BenchSettings": "._results",
    "ShapeResult": "._results", "VariantResult": "._results",
    "CPU_NOTE": "._session", "run_bench": "._session",
}

__all__ = ["CPU_NOTE", "LABELS", "SCHEMA", "SKIPPABLE", "VARIANTS", "BenchReport",
           "BenchSettings", "ServeLoadReport", "ServeLoadSettings", "ShapeResult",
           "VariantResult", "render_cold_start", "render_serve_load", "render_table",
           "run_bench", "run_cold_start", "run_serve_load", "write_json", "write_plot",
           "write_serve_json", "write_serve_plot"]

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
