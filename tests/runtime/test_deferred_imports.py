"""Deferred imports while a model source runs: what is deferred, that a deferred module is the
real one on first use, that nothing outside the scope (other threads, later code) changes,
and that models using the deferred modules still compute what eager PyTorch does.

The speed-up itself is a benchmark (``qkan-pack bench --cold``), not a timed test here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from qkan_pack import build
from qkan_pack.runtime._deferred_imports import (
    DEFERRED_IMPORTS_ENV,
    deferred_imports,
    is_pending,
    reexport_plan,
)

from ..conftest import EXAMPLES, MODELS, ROOT

FAKE_MODULES = {
    "ran_log.py": "RAN = []\n",
    "heavy/__init__.py": "from ran_log import RAN\nRAN.append(__name__)\nVALUE = 41\n"
                         "def plus_one():\n    return VALUE + 1\n",
    "heavy/sub.py": "from ran_log import RAN\nRAN.append(__name__)\nfrom heavy import VALUE\n",
    "heavy2.py": "from ran_log import RAN\nRAN.append(__name__)\n",
    "broken.py": "from ran_log import RAN\nRAN.append(__name__)\nraise RuntimeError('boom')\n",
    "reexp/__init__.py": '"""A re-export-only package."""\n__version__ = "1.0"\n'
                         "from .light import Light\nfrom .heavy_part import Heavy, helper as renamed\n"
                         "from . import light\n__all__ = ['Light', 'Heavy', 'renamed']\n",
    "reexp/light.py": "from ran_log import RAN\nRAN.append(__name__)\nclass Light:\n    pass\n",
    "reexp/heavy_part.py": "from ran_log import RAN\nRAN.append(__name__)\nclass Heavy:\n    pass\n"
                           "def helper():\n    return 'helped'\n",
    "reexp/extra.py": "from ran_log import RAN\nRAN.append(__name__)\n",
    "busy/__init__.py": "from ran_log import RAN\nRAN.append(__name__)\n",
}
FAKE_NAMES = ("ran_log", "heavy", "heavy.sub", "heavy2", "broken", "reexp", "reexp.light",
              "reexp.heavy_part", "reexp.extra", "busy")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[list[str]]:
    """Importable fake packages; yields the log of module bodies that ran, in order."""
    for name, text in FAKE_MODULES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        import ran_log

        yield ran_log.RAN
    finally:
        sys.path.remove(str(tmp_path))
        for name in FAKE_NAMES:
            sys.modules.pop(name, None)


def test_a_deferred_module_runs_on_first_attribute_use_in_place(fake: list[str]) -> None:
    with deferred_imports(modules={"heavy"}, packages=()) as record:
        import heavy
    assert record.deferred == ["heavy"] and fake == []
    assert is_pending(heavy)
    assert heavy.__path__ and heavy.__spec__.name == "heavy" and heavy.__file__  # no body run
    assert fake == []
    assert heavy.plus_one() == 42 and fake == ["heavy"]
    assert sys.modules["heavy"] is heavy and not is_pending(heavy)
    assert "__getattr__" not in vars(heavy)  # the real module, no hook left behind
    assert type(heavy.__spec__.loader).__name__ == "SourceFileLoader"


def test_a_submodule_of_a_deferred_package_waits_too(fake: list[str]) -> None:
    """The import system reads the parent's ``__path__``: answered without running it."""
    with deferred_imports(modules={"heavy", "heavy.sub"}, packages=()):
        import heavy.sub
    assert fake == []
    assert heavy.sub.VALUE == 41
    assert fake == ["heavy.sub", "heavy"]  # the child's body asked the parent for VALUE


def test_a_failing_body_raises_at_first_use_and_is_forgotten(fake: list[str]) -> None:
    with deferred_imports(modules={"broken"}, packages=()):
        import broken
    with pytest.raises(RuntimeError, match="boom"):
        broken.anything  # noqa: B018
    assert "broken" not in sys.modules  # as after a failed import: the next one retries
    with pytest.raises(RuntimeError, match="boom"):
        import broken


def test_a_reexport_package_imports_only_the_submodule_of_a_name(fake: list[str]) -> None:
    with deferred_imports(modules=(), packages={"reexp"}) as record:
        from reexp import Light
    import reexp

    assert record.reexported == ["reexp"]
    assert fake == ["reexp.light"] and Light is sys.modules["reexp.light"].Light
    assert reexp.__version__ == "1.0" and reexp.__doc__ == "A re-export-only package."
    assert is_pending(reexp)
    assert reexp.renamed() == "helped" and fake == ["reexp.light", "reexp.heavy_part"]
    assert reexp.light is sys.modules["reexp.light"]


def test_any_other_name_completes_the_package_as_a_plain_import_would(fake: list[str]) -> None:
    with deferred_imports(modules=(), packages={"reexp"}):
        import reexp
    with pytest.raises(AttributeError):
        reexp.not_there  # noqa: B018
    assert not is_pending(reexp) and "__getattr__" not in vars(reexp)
    assert sorted(fake) == ["reexp.heavy_part", "reexp.light"]
    namespace: dict = {}
    exec("from reexp import *", namespace)
    assert {"Light", "Heavy", "renamed"} <= set(namespace)
    assert {"Light", "Heavy", "renamed", "light", "heavy_part", "__version__"} <= set(dir(reexp))


def test_star_import_and_dir_resolve_every_name(fake: list[str]) -> None:
    with deferred_imports(modules=(), packages={"reexp"}):
        namespace: dict = {}
        exec("from reexp import *", namespace)
    assert namespace["renamed"]() == "helped" and namespace["Heavy"].__name__ == "Heavy"


def test_only_reexport_only_inits_are_reexported(fake: list[str]) -> None:
    with deferred_imports(modules=(), packages={"busy"}) as record:
        import busy  # noqa: F401
    assert record.reexported == [] and fake == ["busy"]  # ran at once: it has a call
    assert reexport_plan("p", "from .a import b\nprint('side effect')\n") is None
    assert reexport_plan("p", "from .a import *\n") is None
    assert reexport_plan("p", "x = compute()\n") is None
    plan = reexport_plan("p", '"""d"""\nfrom __future__ import annotations\nV = (1, "a")\n'
                              "from .a import b as c\nfrom . import d\n")
    assert plan is not None
    assert plan.literals == {"__doc__": "d", "V": (1, "a")}
    assert plan.names == {"c": ("p.a", "b"), "d": ("p.d", None)}


def test_other_threads_import_as_usual_meanwhile(fake: list[str]) -> None:
    seen: dict[str, bool] = {}

    def other_thread() -> None:
        import heavy2

        seen["pending"] = is_pending(heavy2)

    with deferred_imports(modules={"heavy", "heavy2"}, packages=()):
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        import heavy
    assert seen == {"pending": False} and "heavy2" in fake  # ran in its own thread
    assert is_pending(heavy)


def test_nothing_is_deferred_outside_the_scope(fake: list[str]) -> None:
    meta_path = list(sys.meta_path)
    with deferred_imports(modules={"heavy", "heavy2"}, packages=()):
        pass
    assert sys.meta_path == meta_path
    import heavy2

    assert not is_pending(heavy2) and fake == ["heavy2"]


def test_the_escape_hatch_imports_everything_as_usual(fake: list[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEFERRED_IMPORTS_ENV, "0")
    with deferred_imports(modules={"heavy"}, packages=()) as record:
        import heavy  # noqa: F401
    assert record.deferred == [] and fake == ["heavy"]


# -- a fresh process, the real thing: qkan, sympy, matplotlib -----------------------------------

QKAN_CHILD = """
import json, sys, importlib.util
import torch
from safetensors.torch import load_file
from qkan_pack import Predictor
from qkan_pack.runtime._deferred_imports import is_pending

path, example = sys.argv[1], sys.argv[2]
predictor = Predictor.load(path, device="cpu")
state = {n: ("absent" if n not in sys.modules else "pending" if is_pending(sys.modules[n])
             else "real") for n in ("qkan", "qkan.feynman", "qkan.utils", "sympy", "matplotlib",
                                    "matplotlib.pyplot")}
import qkan
done = sorted(dir(qkan))  # completes the package: from here on it is a plain import
spec = importlib.util.spec_from_file_location("twin", example)
twin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(twin)
model = twin.build_model(**predictor.report.config)
model.load_state_dict(load_file(f"{path}/weights.safetensors"))
model.eval()
worst = 0.0
for batch in (1, 64):
    x = torch.randn(batch, 2)
    with torch.no_grad():
        worst = max(worst, float((predictor(x) - model(x)).abs().max()))
print(json.dumps({"state": state, "worst": worst, "feynman": "get_feynman_dataset" in done,
                  "sympy_after": is_pending(sys.modules["sympy"])}))
"""


def _child(code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_serving_a_qkan_never_runs_sympy_or_pyplot_and_equals_eager(mlp_artifact: Path) -> None:
    seen = _child(QKAN_CHILD, str(mlp_artifact), str(EXAMPLES / "qkan_mlp.py"))
    assert seen["state"] == {"qkan": "pending", "qkan.feynman": "absent", "qkan.utils": "absent",
                             "sympy": "absent", "matplotlib": "pending",
                             "matplotlib.pyplot": "pending"}, seen
    assert seen["worst"] == 0.0  # the same CPU kernels on the same weights and inputs
    assert seen["feynman"] and seen["sympy_after"] is False  # later code gets the real thing


def test_without_deferral_qkan_imports_everything(mlp_artifact: Path) -> None:
    seen = _child(QKAN_CHILD, str(mlp_artifact), str(EXAMPLES / "qkan_mlp.py"),
                  env={DEFERRED_IMPORTS_ENV: "0"})
    assert set(seen["state"].values()) == {"real"}, seen
    assert seen["worst"] == 0.0


SYMPY_CHILD = """
import json, sys
import torch
from safetensors.torch import load_file
assert "sympy" not in sys.modules
from qkan_pack import Predictor
path = sys.argv[1]
predictor = Predictor.load(path, device="cpu")
weights = load_file(f"{path}/weights.safetensors")
worst = 0.0
for _ in range(3):
    x = torch.randn(5, 4)
    eager = (x @ weights["linear.weight"].T + weights["linear.bias"]) * 12.0 + 1.0 / 3.0
    worst = max(worst, float((predictor(x) - eager).abs().max()))
from qkan_pack.runtime._deferred_imports import is_pending
print(json.dumps({"worst": worst, "sympy_pending": is_pending(sys.modules["sympy"])}))
"""


def test_a_model_that_uses_sympy_at_import_and_in_forward_still_works(tmp_path: Path) -> None:
    artifact = build(MODELS / "sympy_model.py", "5x4", output=tmp_path / "sympy_model").path
    seen = _child(SYMPY_CHILD, str(artifact))
    assert seen["sympy_pending"] is False  # used at import: it ran, in place
    assert seen["worst"] < 1e-5


def test_building_defers_too_and_the_reference_is_right(tmp_path: Path) -> None:
    """``build`` imports the model source through the same function: run it in a fresh
    process (where sympy is not imported yet) and check the recorded reference outputs."""
    code = textwrap.dedent("""
        import sys
        from qkan_pack import build
        build(sys.argv[1], "5x4", output=sys.argv[2])
        print("{}")
    """)
    _child(code, str(MODELS / "sympy_model.py"), str(tmp_path / "built"))
    seen = _child(SYMPY_CHILD, str(tmp_path / "built"))
    assert seen["worst"] < 1e-5
