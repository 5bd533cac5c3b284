"""Benchmarks in the product: ``qkan-pack bench`` (side by side in one process, cold starts
in fresh processes), tables, JSON and plots. Uses the runtime's own capture primitives for
its bare-graph baseline; imports nothing of builder or serve."""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._names import LABELS, SKIPPABLE, VARIANTS

if TYPE_CHECKING:
    from ._cold import run_cold_start
    from ._plot import write_plot
    from ._render import render_cold_start, render_table, write_json
    from ._results import SCHEMA, BenchReport, BenchSettings, ShapeResult, VariantResult
    from ._session import CPU_NOTE, run_bench

_LAZY = {
    "run_cold_start": "._cold",
    "render_cold_start": "._render", "render_table": "._render", "write_json": "._render",
    "write_plot": "._plot",
    "SCHEMA": "._results", "BenchReport": "._results", "BenchSettings": "._results",
    "ShapeResult": "._results", "VariantResult": "._results",
    "CPU_NOTE": "._session", "run_bench": "._session",
}

__all__ = ["CPU_NOTE", "LABELS", "SCHEMA", "SKIPPABLE", "VARIANTS", "BenchReport",
           "BenchSettings", "ShapeResult", "VariantResult", "render_cold_start", "render_table",
           "run_bench", "run_cold_start", "write_json", "write_plot"]

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
