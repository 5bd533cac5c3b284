"""The serving path: read and verify an artifact, rebuild its model, capture, replay.

What a production process imports is this package, ``format`` and ``errors`` (plus the
model's own source): nothing of builder, bench, serve or cli. Torch-free names import
eagerly; the rest on first use, so that ``inspect`` and ``--help`` stay instant.

Public here for the tools above (builder, bench, serve): the primitives they share with
the load path, so that each exists once (one capture recipe, one comparison, one device
resolver, one versions function, one output walker).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._artifact import VerifiedArtifact, artifact_digest, read_artifact, safetensors_header, sha256_hex
from ._deferred_imports import DEFERRED_IMPORTS_ENV, module_state
from ._kernels import TRITON_CACHE_ENV, collect_kernel_cache, inductor_file, kernel_key
from ._options import (
    COMPILED_MODES,
    CROSS_DEVICE_TOLERANCE,
    CROSS_SOLVER_TOLERANCE,
    INDUCTOR_MODE,
    REPLAY_TOLERANCE,
    SAME_HOST_TOLERANCE,
    LoadOptions,
    Tolerance,
)
from ._signature import code_signing_problem
from ._source import (
    accepts_device,
    call_factory,
    check_entry_named,
    content_name,
    describe,
    entry_function,
    import_model_source,
    model_code_failed,
    referenced_modules,
)
from ._triton_compat import record_installation, triton_key_file

if TYPE_CHECKING:
    from ._calling import bind_forward, full_float32
    from ._capture import (
        WARMUP_CALLS,
        CaptureStreams,
        GraphPool,
        ShapeGraph,
        capture_graph,
        capture_session,
        capture_streams,
        check_context,
        clear_cublas_workspaces,
        flat_forward,
        release_graph_memory,
        warm_up,
    )
    from ._compat import installed_version, package_versions
    from ._device import resolve_device
    from ._diagnose import explain_capture_failure
    from ._inputs import InputMatcher
    from ._load import eager_forward, model_solvers, rebuild_model, reference_samples
    from ._predictor import Predictor
    from ._progress import progress_bar
    from ._report import LoadReport, ShapeRecord
    from ._runners import EagerRunner, GraphRunner
    from ._selftest import check_outputs, compare, float64_noise, uninformative_outputs
    from ._submodules import SubmoduleGraphs, select_submodules
    from ._tree import (
        ClassTable,
        describe_output,
        dtype_name,
        flatten,
        iter_leaves,
        map_leaves,
        resolve_output_classes,
        torch_dtype,
        unflatten,
    )
    from ._weights import load_strict, parse_weights

_LAZY = {
    "bind_forward": "_calling", "full_float32": "_calling",
    "explain_capture_failure": "_diagnose",
    "InputMatcher": "_inputs",
    "ClassTable": "_tree", "resolve_output_classes": "_tree", "iter_leaves": "_tree",
    "WARMUP_CALLS": "_capture", "CaptureStreams": "_capture", "GraphPool": "_capture",
    "ShapeGraph": "_capture",
    "capture_graph": "_capture", "capture_session": "_capture", "capture_streams": "_capture",
    "check_context": "_capture", "clear_cublas_workspaces": "_capture",
    "flat_forward": "_capture", "release_graph_memory": "_capture", "warm_up": "_capture",
    "installed_version": "_compat", "package_versions": "_compat",
    "resolve_device": "_device",
    "eager_forward": "_load", "model_solvers": "_load", "rebuild_model": "_load",
    "reference_samples": "_load",
    "Predictor": "_predictor",
    "progress_bar": "_progress",
    "LoadReport": "_report", "ShapeRecord": "_report",
    "EagerRunner": "_runners", "GraphRunner": "_runners",
    "check_outputs": "_selftest", "compare": "_selftest",
    "float64_noise": "_selftest", "uninformative_outputs": "_selftest",
    "SubmoduleGraphs": "_submodules", "select_submodules": "_submodules",
    "describe_output": "_tree", "dtype_name": "_tree", "flatten": "_tree",
    "map_leaves": "_tree", "torch_dtype": "_tree", "unflatten": "_tree",
    "load_strict": "_weights", "parse_weights": "_weights",
}

__all__ = [
    "COMPILED_MODES",
    "CROSS_DEVICE_TOLERANCE",
    "CROSS_SOLVER_TOLERANCE",
    "DEFERRED_IMPORTS_ENV",
    "INDUCTOR_MODE",
    "REPLAY_TOLERANCE",
    "SAME_HOST_TOLERANCE",
    "TRITON_CACHE_ENV",
    "WARMUP_CALLS",
    "CaptureStreams",
    "ClassTable",
    "EagerRunner",
    "GraphPool",
    "GraphRunner",
    "InputMatcher",
    "LoadOptions",
    "LoadReport",
    "Predictor",
    "ShapeGraph",
    "ShapeRecord",
    "SubmoduleGraphs",
    "Tolerance",
    "VerifiedArtifact",
    "accepts_device",
    "artifact_digest",
    "bind_forward",
    "call_factory",
    "capture_graph",
    "capture_session",
    "capture_streams",
    "check_context",
    "check_entry_named",
    "check_outputs",
    "clear_cublas_workspaces",
    "code_signing_problem",
    "collect_kernel_cache",
    "compare",
    "content_name",
    "describe",
    "describe_output",
    "dtype_name",
    "eager_forward",
    "entry_function",
    "explain_capture_failure",
    "flat_forward",
    "flatten",
    "float64_noise",
    "full_float32",
    "import_model_source",
    "inductor_file",
    "installed_version",
    "iter_leaves",
    "kernel_key",
    "load_strict",
    "map_leaves",
    "model_code_failed",
    "model_solvers",
    "module_state",
    "package_versions",
    "parse_weights",
    "progress_bar",
    "read_artifact",
    "rebuild_model",
    "record_installation",
    "reference_samples",
    "referenced_modules",
    "release_graph_memory",
    "resolve_device",
    "resolve_output_classes",
    "safetensors_header",
    "select_submodules",
    "sha256_hex",
    "torch_dtype",
    "triton_key_file",
    "unflatten",
    "uninformative_outputs",
    "warm_up",
]


__getattr__ = lazy_getattr(__name__, {name: f".{module}" for name, module in _LAZY.items()},
                           globals())


def __dir__() -> list[str]:
    return __all__
