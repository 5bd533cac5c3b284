"""The architecture as tests: pinned public names per layer, the errors' shape, a serving
path that imports nothing of the tools, and private modules left private.

The import direction itself (layers, no cycles) is checked by import-linter in CI
(``lint-imports``, contracts in pyproject.toml).
"""

from __future__ import annotations

import ast
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import qkan_pack
from qkan_pack import errors

from .conftest import ROOT

PUBLIC = {
    "qkan_pack": [
        "FORMAT_NAME", "FORMAT_VERSION", "AotiPackageError", "ArtifactError",
        "ArtifactSignatureError", "BenchError", "BuildOptions", "BuildResult",
        "CaptureError", "DeviceError", "DigestMismatchError", "FactoryNotReproducibleError",
        "IncompatibleArtifactError", "InputError", "InputFileError", "KernelCacheError",
        "LoadOptionError", "LoadOptions", "LoadReport", "MalformedRequestError",
        "Manifest", "ManifestError", "ModelSourceError", "OptionError", "PaddingError", "Predictor",
        "PrecisionError", "PredictorClosedError", "QkanPackError",
        "SelfTestError", "ShapeSpecError", "VerifiedArtifact", "WeakReferencesError",
        "WeightsMismatchError", "FileReadError", "OverloadedError", "PlacementError",
        "ReplicaLoadError",
        "RepositoryError", "ServeError", "ServeTokenError", "StatefulModelError",
        "PrecompileRefusedError", "__version__", "build", "parse_manifest", "parse_shapes", "read_artifact",
    ],
    "qkan_pack.builder": ["BuildOptions", "BuildResult", "SignResult", "WarmResult", "build",
                          "check_warm_device", "sign", "warm", "write_artifact"],
    "qkan_pack.serve": ["DEFAULT_MAX_BODY_BYTES", "INGRESSES", "ArtifactServer", "HttpLimits",
                        "Listen", "NoopServer", "ReplicaLoad", "ServeOptions", "add_inference_service",
                        "app_builder", "build_app", "check_token",
                        "describe_artifact", "encode_outputs", "fit", "parse_request",
                        "parse_tensor", "read_token_file", "replica_device_text", "row_plan",
                        "serve_forever", "signature_text", "token_digest"],
    "qkan_pack.bench": ["COLD_SCHEMA", "COLD_VARIANTS", "CPU_NOTE", "LABELS", "SCHEMA",
                        "SKIPPABLE", "VARIANTS", "BenchReport", "BenchSettings", "ColdSettings",
                        "ServeLoadReport", "ServeLoadSettings", "ShapeResult", "VariantResult",
                        "is_repository", "render_cold", "render_repository_load",
                        "render_serve_load", "render_table", "run_bench", "run_cold",
                        "run_repository_load", "run_serve_load", "write_cold_json", "write_cold_plot",
                        "write_json", "write_plot", "write_serve_json", "write_serve_plot"],
    "qkan_pack.runtime": [
        "ARRAY_SUFFIXES", "read_array_file", "cpu_model",
        "PaddedAgreement", "cut_inputs", "padded_agreement", "sizes_text", "values_text",
        "proof_agreement", "proof_bound", "check_int_range", "HALF_CEILING", "pad_inputs",
        "CHANNEL_MIN_ROWS", "ChannelPool", "REQUEST_KEYS", "Agreement", "float64_forward",
        "float64_outputs", "float64_throughout", "kernel_name",
        "leaf_names_of", "spread_for",
        "PLAN_FILE", "PrecompiledExport", "precompiled_dir", "process_environment",
        "HOST_DTYPES", "check_finite", "fit_numbers", "host_array", "json_input", "numbers_array",
        "B64_KEYS", "ENCODINGS", "b64_tensor", "is_b64_tensor", "typed_input", "wire_values",
        "output_path", "refuse_unsafe_output",
        "INDUCTOR_MODE", "LoadOptions", "LoadReport", "Predictor", "ShapeGraph",
        "TRITON_CACHE_ENV", "VerifiedArtifact", "WARMUP_CALLS", "accepts_device",
        "artifact_digest", "bind_forward", "call_factory", "capture_graph", "capture_session",
        "capture_streams", "check_context", "check_entry_named", "code_signing_problem",
        "collect_kernel_cache", "compare", "content_name", "describe", "describe_output",
        "dtype_name", "entry_function", "flat_forward", "flatten", "float64_noise",
        "full_float32", "import_model_source", "inductor_file", "kernel_key", "latencies",
        "load_strict", "map_leaves", "model_code_failed", "model_solvers", "module_state",
        "output_errors", "package_versions", "parse_weights", "precision_key",
        "precision_scope", "precision_unavailable", "progress_bar", "read_artifact",
        "open_regular_file", "read_regular_file", "rebuild_model", "record_installation",
        "reference_samples", "referenced_modules", "release_graph_memory", "resolve_device",
        "resolve_output_classes", "safetensors_header", "served_forward", "sha256_hex",
        "structure_difference", "torch_dtype",
        "triton_key_file", "uninformative_outputs", "warm_up",
        "channels_last_applies", "to_channels_last",
    ],
    "qkan_pack.format": [
        "AUTO_PRECISION", "CAPTURE_POLICIES", "COMPILED_MODES", "CapturePolicy", "DEFAULT_MAX_ERROR",
        "CHANNELS_LAST", "CONTIGUOUS", "LAYOUTS", "LayoutFigures", "candidate_name",
        "DEFAULT_VERSION", "DEVICE_TEXT", "DIGEST_PREFIX", "DTYPES", "DType",
        "FORMAT_NAME", "FORMAT_VERSION", "FileEntry", "IDENTIFIER", "INTEGER_DTYPES",
        "InputDecl", "KERNELS_DIR", "KernelSet", "MANIFEST_NAME", "MAX_DIM",
        "MAX_MANIFEST_BYTES", "MAX_RANK", "MAX_REFERENCE_BYTES", "MAX_SEED", "MAX_SHAPES",
        "MAX_SIGNATURE_BYTES", "MAX_MAX_ERROR", "PRECISIONS", "Precision", "PrecisionChoice",
        "PrecisionPolicy",
        "MODEL_NAME", "Manifest", "Metadata", "ModelInfo", "OutputClass", "PadValue", "PaddedAxis", "Padding",
        "OutputNode", "REFERENCE_DIR", "MAX_ROW_DETAIL", "RowProof", "entry_batch", "input_batch",
        "SHA256_HEX", "SIGNATURE_NAME", "SOURCE_DIR", "Shape", "ShapeEntry", "Signature",
        "TensorSpec", "WEIGHTS_NAME", "WHEN_DEFAULT", "check_config", "check_device_text", "check_dtype",
        "accepted_ranges", "check_class_labels", "check_metadata", "check_pad_value", "check_range",
        "check_reference_bytes", "check_seed",
        "describe_axes", "dumps_manifest", "embedding_range", "find_axes", "fit_entry",
        "format_shape", "geometric_mean", "loads_strict", "manifest_schema",
        "manifest_to_dict", "metadata_to_dict", "padding_table", "pair_inputs", "parse_batch_sizes",
        "parse_config_items", "parse_input_option",
        "parse_manifest", "parse_range", "parse_shape", "parse_shapes",
        "precision_choice_to_dict", "shape_fix", "with_batch_sizes",
        # the declarative JSON the manifest and the precompiled plan are read and written by
        "Choice", "Integer", "JsonObject", "ListOf", "Nested", "Text", "json_field",
        "read_object", "write_object",
    ],
    "qkan_pack.predict": ["INPUT_SUFFIXES", "OUTPUT_SUFFIXES", "check_output", "named_outputs",
                          "read_inputs", "summarize", "write_outputs"],
}
#: Layers (top to bottom) and where private modules may be imported from in tests.
SUBPACKAGES = ("builder", "bench", "serve", "predict", "runtime", "format")


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_names_are_pinned(package: str) -> None:
    module = __import__(package, fromlist=["__all__"])
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError):
        module.not_a_name  # noqa: B018


def test_every_error_class_lives_in_errors_and_the_package_exports_it() -> None:
    """One error tree: every ``QkanPackError`` subclass the package defines is in
    ``errors.__all__`` (so ``from qkan_pack import X`` works for any error a user may
    catch), and none is defined outside ``errors.py``."""
    import importlib
    import inspect
    import pkgutil

    import qkan_pack
    from qkan_pack import errors

    defined = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, errors.QkanPackError)}
    assert defined == set(errors.__all__)
    assert set(errors.__all__) <= set(qkan_pack.__all__)
    elsewhere = []
    for info in pkgutil.walk_packages(qkan_pack.__path__, "qkan_pack."):
        if info.name in ("qkan_pack.errors", "qkan_pack.__main__"):
            continue
        module = importlib.import_module(info.name)
        elsewhere += [f"{info.name}.{name}" for name, value in vars(module).items()
                      if inspect.isclass(value) and issubclass(value, errors.QkanPackError)
                      and value.__module__ == info.name]
    assert not elsewhere, elsewhere


def test_runtime_and_format_export_what_they_list() -> None:
    import qkan_pack.format as fmt
    import qkan_pack.runtime as runtime

    for module in (fmt, runtime):
        assert len(set(module.__all__)) == len(module.__all__)
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
        assert not [n for n in module.__all__ if n.startswith("_")]
    assert dir(qkan_pack) == sorted(PUBLIC["qkan_pack"])


def test_type_checkers_see_every_module_runtime_resolves_on_first_use() -> None:
    """``runtime`` imports its torch-backed modules on first use (``_lazy.module_exports``);
    its ``TYPE_CHECKING`` block names the same modules, so that mypy types those names
    instead of taking them as ``Any``."""
    tree = ast.parse((ROOT / "qkan_pack" / "runtime" / "__init__.py").read_text())
    lazy = {ast.literal_eval(item) for call in ast.walk(tree)
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "module_exports"
            for item in call.args[1].elts}
    checked = {f".{node.module}" for block in ast.walk(tree)
               if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
               for node in block.body if isinstance(node, ast.ImportFrom)}
    assert lazy and checked == lazy


def test_every_error_is_a_qkan_pack_error_and_its_builtin() -> None:
    builtin = {"ShapeSpecError": ValueError, "ManifestError": ValueError, "ArtifactError": OSError,
               "ModelSourceError": ImportError, "WeightsMismatchError": ValueError,
               "SelfTestError": RuntimeError, "CaptureError": RuntimeError,
               "DeviceError": RuntimeError, "KernelCacheError": RuntimeError,
               "BenchError": RuntimeError, "ServeError": RuntimeError, "InputError": ValueError,
               "MalformedRequestError": errors.InputError,
               "PredictorClosedError": errors.InputError, "LoadOptionError": errors.OptionError,
               "IncompatibleArtifactError": errors.ManifestError,
               "DigestMismatchError": errors.ArtifactError,
               "ArtifactSignatureError": errors.ArtifactError,
               "OverloadedError": errors.ServeError, "PlacementError": errors.ServeError,
               "FactoryNotReproducibleError": errors.ModelSourceError,
               "WeakReferencesError": ValueError, "InputFileError": ValueError,
               "FileReadError": OSError,
               "OptionError": ValueError, "PaddingError": ValueError,
               "PrecisionError": errors.SelfTestError,
               "ServeTokenError": errors.ServeError, "ReplicaLoadError": errors.ServeError,
               "RepositoryError": errors.ServeError,
               "PrecompileRefusedError": RuntimeError, "StatefulModelError": errors.ModelSourceError,
               "AotiPackageError": errors.PrecompileRefusedError}
    for name, base in builtin.items():
        cls = getattr(errors, name)
        assert issubclass(cls, errors.QkanPackError) and issubclass(cls, base), name
    assert sorted(errors.__all__) == sorted([*builtin, "QkanPackError"])


ERRORS_WITH_FIELDS = [
    (errors.InputError("input shape 3x2 is not in the manifest",
                       accepted=[{"x": ((1, 2), "float32")}, {"x": ((64, 2), "float32")}]),
     {"accepted": ({"x": ((1, 2), "float32")}, {"x": ((64, 2), "float32")})},
     "accepted: 1x2 float32 | 64x2 float32"),
    (errors.CaptureError("RuntimeError: .item() during capture", shape="1x2", module="blocks.0"),
     {"shape": "1x2", "module": "blocks.0", "op": "RuntimeError: .item() during capture"},
     "submodule blocks.0 shape 1x2"),
    (errors.SelfTestError(shape="8x2", compared="a and b", max_abs=0.5, tolerance=(1e-4, 1e-5),
                          hint="fix it"),
     {"shape": "8x2", "max_abs": 0.5, "tolerance": (1e-4, 1e-5)}, "differ by up to 0.5"),
    (errors.PrecisionError(precision="bf16", device="cuda:0", max_error=1e-2,
                           figures=[("8x32", "logits", 3.1e-2), ("1x32", "logits", 2e-2)],
                           build_measured=2.9e-2),
     {"precision": "bf16", "device": "cuda:0", "max_error": 1e-2, "output": "logits",
      "measured": 3.1e-2, "shape": "8x32", "build_measured": 2.9e-2, "tolerance": (0.0, 1e-2)},
     "bf16 on cuda:0: logits differs by 0.031 of its scale > 0.01 (shape 8x32)"),
    (errors.WeightsMismatchError(source="w.pt", problems=["missing: a", "unexpected: b"]),
     {"source": "w.pt", "problems": ("missing: a", "unexpected: b")}, "missing: a"),
    (errors.DigestMismatchError(path="/a", actual="sha256:aa", expected="sha256:bb"),
     {"path": "/a", "actual": "sha256:aa", "expected": "sha256:bb"}, "sha256:bb was pinned"),
    (errors.LoadOptionError(option="replay_tolerance", value=(float("inf"), 0.0),
                            expected="two finite numbers"),
     {"option": "replay_tolerance", "expected": "two finite numbers"}, "replay_tolerance=(inf"),
    (errors.PredictorClosedError(path="/a"), {"path": "/a"}, "is closed"),
    (errors.ArtifactSignatureError(path="/a", problem="untrusted", detail="key sha256:12ab"),
     {"path": "/a", "problem": "untrusted", "detail": "key sha256:12ab"}, "none of the trusted"),
    (errors.OverloadedError(ongoing=64, queued=64), {"ongoing": 64, "queued": 64,
                                                     "hint": "retry after Retry-After seconds"},
     "64 requests at work and 64 waiting"),
    (errors.PlacementError(kind="CPU", replicas={"": 3}, need=3.0, have=2.0, each=1.0,
                           hint="lower --replicas"),
     {"kind": "CPU", "replicas": {"": 3}, "need": 3.0, "have": 2.0, "each": 1.0, "left": False},
     "cannot place 3 replicas x 1 CPU; this cluster has 2; lower --replicas"),
    (errors.PlacementError(kind="CPU", replicas={"mlp/2": 4}, need=1.6, have=0.8, each=0.4,
                           left=True),
     {"replicas": {"mlp/2": 4}, "left": True},
     "cannot place 4 replicas x 0.4 CPU (mlp/2: 4): they need 1.6 CPU; this cluster has 0.8 "
     "left"),
    (errors.ReplicaLoadError(node_ip="10.0.0.7", node_id="ab12", path="/models/m",
                             reason="ArtifactError: no artifact at /models/m"),
     {"node_ip": "10.0.0.7", "node_id": "ab12", "path": "/models/m"},
     "the replica on node 10.0.0.7 (id ab12) cannot load the artifact at /models/m"),
    (errors.RepositoryError(path="/repo", problems=["mlp/0: not a positive integer",
                                                    "x/1: names model 'y'"]),
     {"path": "/repo", "problems": ("mlp/0: not a positive integer", "x/1: names model 'y'")},
     "model repository /repo: mlp/0: not a positive integer; x/1: names model 'y'"),
]


@pytest.mark.parametrize(("error", "fields", "says"), ERRORS_WITH_FIELDS,
                         ids=lambda v: type(v).__name__ if isinstance(v, Exception) else "")
def test_errors_carry_their_data_and_survive_pickling(error: Exception, fields: dict,
                                                      says: str) -> None:
    """Callers branch on fields; messages are built from them; Ray pickles errors."""
    for copy in (error, pickle.loads(pickle.dumps(error))):
        assert type(copy) is type(error)
        assert str(copy) == str(error) and says in str(copy)
        for name, value in fields.items():
            assert getattr(copy, name) == value, name


SERVING_PATH = """
import json, sys
from qkan_pack import Predictor
predictor = Predictor.load(sys.argv[1])
import numpy
predictor(numpy.zeros((1, 2), numpy.float32))
from qkan_pack.runtime import module_state
ours = sorted(m for m in sys.modules if m.startswith("qkan_pack"))
states = {m: module_state(m) for m in ("click", "matplotlib", "matplotlib.pyplot", "ray", "sympy")}
print(json.dumps({"ours": ours, "states": states}))
"""


@pytest.mark.parametrize(("model", "heavy"), [
    ("plain_mlp.py", {}),
    ("qkan_mlp.py", {"matplotlib": "deferred", "matplotlib.pyplot": "deferred"}),
])
def test_serving_path_imports_only_runtime_format_and_errors(tmp_path: Path, model: str,
                                                            heavy: dict[str, str]) -> None:
    """A production process's load imports nothing of builder, bench, serve or cli, and runs
    no click, matplotlib, sympy or Ray: a plain model imports none of them; a QKAN model's
    source imports qkan, whose matplotlib imports stay deferred (never executed) and whose
    sympy is never imported."""
    from qkan_pack import build

    from .conftest import EXAMPLES, MODELS

    source = (EXAMPLES if model == "qkan_mlp.py" else MODELS) / model
    artifact = build(source, "1x2", output=tmp_path / "a").path
    done = subprocess.run([sys.executable, "-c", SERVING_PATH, str(artifact)],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    layers = {name.split(".")[1] for name in seen["ours"] if name.count(".") >= 1}
    assert layers <= {"errors", "format", "runtime", "_version", "_lazy", "_extras", "_supported",
                      "_checked", "_accepted"}, seen["ours"]
    absent = dict.fromkeys(("click", "matplotlib", "matplotlib.pyplot", "ray", "sympy"), "absent")
    assert seen["states"] == {**absent, **heavy}


WHAT_AN_IMPORT_LOADS = """
import json, sys
before = set(sys.modules)
import {module}
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _loaded_by(module: str) -> list[str]:
    """The modules ``import module`` adds to a fresh interpreter's."""
    done = subprocess.run([sys.executable, "-c", WHAT_AN_IMPORT_LOADS.format(module=module)],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_qkan_pack_loads_the_errors_and_nothing_else() -> None:
    """``import qkan_pack`` (a client catching our errors, reading ``__version__``) loads
    the error tree and the lazy-name table: the format's dataclasses (milliseconds to create)
    wait for the first use of a format name, torch for the first torch-backed one, and no
    module of ours imports ``typing`` at run time (``TYPE_CHECKING = False`` keeps it for
    type checkers)."""
    loaded = _loaded_by("qkan_pack")
    ours = [name for name in loaded if name.startswith("qkan_pack")]
    assert ours == ["qkan_pack", "qkan_pack._lazy", "qkan_pack._version", "qkan_pack.errors"]
    assert "typing" not in loaded


def test_import_qkan_pack_format_loads_no_typing_torch_or_numpy() -> None:
    """``inspect`` and ``--help`` read the format torch-free; its modules keep ``typing`` for
    type checkers only."""
    loaded = _loaded_by("qkan_pack.format")
    assert not {"typing", "torch", "numpy", "safetensors"} & set(loaded), loaded
    assert {name.split(".")[1] for name in loaded if name.startswith("qkan_pack.")} == {
        "_lazy", "_version", "errors", "format"}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


#: Files that may import a layer's private modules, and the layers: a test checking one
#: layer's private output against another's private reader (bench-serve's request encoders
#: against the server's protocol parser), and a device probe timing the steps of a private
#: route one by one (warm's AOTInductor compile).
CROSS_LAYER_TESTS = {("tests", "serve", "test_oip.py"): ("bench",),
                     ("benchmarks", "device", "aoti_compile_time.py"): ("runtime",)}


def test_private_modules_are_imported_only_by_their_own_tests() -> None:
    """Examples, benchmarks and tests use public names; a private module
    ``qkan_pack.<layer>._x`` is imported only by the tests under ``tests/<layer>/``
    (and the few files of ``CROSS_LAYER_TESTS``), a top-level one ``qkan_pack._x`` only by
    its own ``tests/test_x.py``."""
    offenders = []
    for folder in ("tests", "examples", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT)
            for name in _imports(path):
                parts = name.split(".")
                if parts[0] != "qkan_pack" or not any(p.startswith("_") and p != "__version__"
                                                      for p in parts[1:]):
                    continue
                own_tests = (relative.parts[:2] == ("tests", parts[1])
                             or relative.parts == ("tests", f"test{parts[1]}.py")
                             or parts[1] in CROSS_LAYER_TESTS.get(relative.parts, ()))
                if not own_tests:
                    offenders.append(f"{relative}: {name}")
    assert offenders == []


#: The size a module may grow to before it is split by what it does (docs/ARCHITECTURE.md).
PACKAGE = Path(qkan_pack.__file__).parent
MAX_MODULE_LINES = 600
#: Parameters a function may take; more calls for an options object (``BuildOptions``,
#: ``ReplicaLoad``). Click commands take one per option and are exempt.
MAX_PARAMETERS = 8


def test_no_module_is_longer_than_the_limit() -> None:
    long = {str(path.relative_to(PACKAGE.parent)): lines
            for path in PACKAGE.rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these by what they do: {long}"


def _is_click_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("command" in ast.unparse(decorator) or "option" in ast.unparse(decorator)
               for decorator in node.decorator_list)


def test_no_function_takes_more_than_eight_parameters() -> None:
    wide = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args
            names = [a.arg for a in (*arguments.posonlyargs, *arguments.args,
                                     *arguments.kwonlyargs) if a.arg not in ("self", "cls")]
            if len(names) > MAX_PARAMETERS and not _is_click_command(node):
                wide.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} "
                            f"({len(names)})")
    assert wide == [], f"pass an options object instead: {wide}"
