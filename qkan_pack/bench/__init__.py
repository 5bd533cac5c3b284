"""Benchmarks in the product: ``qkan-pack bench`` (side by side in one process),
``qkan-pack bench --cold`` (process start -> first result in fresh processes) and
``qkan-pack bench-serve`` (a load test over HTTP and gRPC), tables, JSON and plots. Uses the
runtime's own capture primitives for its bare-graph baseline; imports nothing of builder or
serve (``bench-serve`` starts the server as a process and drives it over the network)."""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._names import COLD_VARIANTS, LABELS, SKIPPABLE, VARIANTS

if TYPE_CHECKING:
    from ._cold import COLD_SCHEMA, ColdSettings, run_cold, write_cold_json
    from ._cold_render import render_cold, write_cold_plot
    from ._plot import write_plot, write_serve_plot
    from ._render import render_table, write_json
    from ._repo_load import is_repository, render_repository_load, run_repository_load
    from ._results import SCHEMA, BenchReport, BenchSettings, ShapeResult, VariantResult
    from ._serve_load import ServeLoadSettings, run_serve_load
    from ._serve_render import render_serve_load, write_serve_json
    from ._serve_results import ServeLoadReport
    from ._session import CPU_NOTE, run_bench

_LAZY = {
    "COLD_SCHEMA": "._cold", "ColdSettings": "._cold",
    "run_cold": "._cold", "write_cold_json": "._cold",
    "render_cold": "._cold_render", "write_cold_plot": "._cold_render",
    "render_table": "._render", "write_json": "._render",
    "is_repository": "._repo_load", "render_repository_load": "._repo_load",
    "run_repository_load": "._repo_load",
    "write_plot": "._plot", "write_serve_plot": "._plot",
    "ServeLoadReport": "._serve_results", "ServeLoadSettings": "._serve_load",
    "run_serve_load": "._serve_load",
    "render_serve_load": "._serve_render", "write_serve_json": "._serve_render",
    "SCHEMA": "._results", "BenchReport": "._results", "BenchSettings": "._results",
    "ShapeResult": "._results", "VariantResult": "._results",
    "CPU_NOTE": "._session", "run_bench": "._session",
}

__all__ = ["COLD_SCHEMA", "COLD_VARIANTS", "CPU_NOTE", "LABELS", "SCHEMA", "SKIPPABLE",
           "VARIANTS", "BenchReport", "BenchSettings", "ColdSettings", "ServeLoadReport",
           "ServeLoadSettings", "ShapeResult", "VariantResult", "is_repository", "render_cold",
           "render_repository_load", "render_serve_load", "render_table", "run_bench",
           "run_cold", "run_repository_load", "run_serve_load", "write_cold_json",
           "write_cold_plot", "write_json", "write_plot", "write_serve_json",
           "write_serve_plot"]

__getattr__ = lazy_getattr(__name__, globals(), _LAZY)
