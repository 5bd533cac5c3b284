"""Defer the imports a served model never uses, only while its source is being imported.

``import qkan`` costs seconds on a fresh host although serving a QKAN touches none of the
expensive parts: qkan's ``__init__`` imports ``qkan.feynman`` (``from sympy import *``),
``qkan.utils`` (``import sympy``) and ``qkan.qkan`` (``import matplotlib.pyplot``, used only
by plotting methods). While a model source runs, ``deferred_imports()`` puts one meta-path
finder in front of the import system that, for the importing thread only:

- binds ``DEFERRED_MODULES`` as *deferred modules*: the module object (with its real spec,
  ``__path__``, ``__file__`` and loader) goes into ``sys.modules`` at once and its body runs
  on the first attribute lookup it cannot answer (PEP 562 ``__getattr__``), in the same
  module object, so every reference taken earlier becomes the real module;
- binds ``REEXPORT_PACKAGES`` (whose ``__init__`` only re-exports names of its submodules
  and assigns literals) as *re-export packages*: a name such as ``qkan.QKAN`` imports just
  the submodule that defines it; any other lookup (``qkan.feynman``, ``dir(qkan)``) runs the
  real ``__init__`` in place, after which the package is exactly what a plain import gives.

Why not ``importlib.util.LazyLoader`` (as of qkan 0.2.3): a lazy package loads on
*any* attribute, ``__path__`` included, which the import system reads to import a
submodule, so ``import matplotlib.pyplot`` still loads matplotlib; and ``from sympy import
*`` inside ``qkan.feynman``, imported by qkan's ``__init__``, loads sympy. Deferral through
``__getattr__`` answers ``__path__``/``__spec__`` without loading, and the re-export package
never runs ``qkan.feynman`` unless something asks for it.

Outside the scope nothing changes: modules already imported are untouched (the finder is
never asked about them), other threads import as usual, and a deferred module left in
``sys.modules`` loads itself when code outside the load first uses it.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any, NamedTuple

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["module_state"]


#: Heavy modules a served model does not call (symbolic math, plotting).
DEFERRED_MODULES = frozenset({"sympy", "matplotlib", "matplotlib.pyplot"})
#: Packages whose ``__init__`` only re-exports: a name imports just its own submodule.
REEXPORT_PACKAGES = frozenset({"qkan"})
#: ``QKAN_PACK_DEFERRED_IMPORTS=0`` imports everything as usual (an escape hatch, and the
#: baseline of the cold-start benchmark).
DEFERRED_IMPORTS_ENV = "QKAN_PACK_DEFERRED_IMPORTS"


class DeferralRecord:
    """What a scope deferred (module names, in import order), for reports and tests.

    (Plain classes here, not dataclasses: this module is on every load's import path, and
    each dataclass costs about a millisecond to create.)
    """

    def __init__(self) -> None:
        self.deferred: list[str] = []
        self.reexported: list[str] = []

    def __repr__(self) -> str:
        return f"DeferralRecord(deferred={self.deferred}, reexported={self.reexported})"


@contextlib.contextmanager
def deferred_imports(modules: Iterable[str] = DEFERRED_MODULES,
                     packages: Iterable[str] = REEXPORT_PACKAGES) -> Iterator[DeferralRecord]:
    """Defer ``modules`` and re-export ``packages`` for imports this thread makes inside."""
    if os.environ.get(DEFERRED_IMPORTS_ENV) == "0":
        yield DeferralRecord()
        return
    finder = _ScopedFinder(frozenset(modules), frozenset(packages))
    sys.meta_path.insert(0, finder)
    try:
        yield finder.record
    finally:
        finder.active = False
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


def module_state(name: str) -> str:
    """``"absent"``, ``"deferred"`` (in ``sys.modules``, body not run yet) or ``"imported"``."""
    module = sys.modules.get(name)
    if module is None:
        return "absent"
    return "deferred" if is_pending(module) else "imported"


def is_pending(module: ModuleType) -> bool:
    """Whether ``module``'s body (a re-export package's ``__init__``) has not run yet because
    it was deferred; never triggers it."""
    hook = module.__dict__.get("__getattr__")
    if isinstance(hook, _ReexportedName):
        hook = hook.full
    return isinstance(hook, _PendingBody) and not hook.started


class _ScopedFinder(importlib.abc.MetaPathFinder):
    """Hands out deferring loaders for the owner thread while the scope is active."""

    def __init__(self, modules: frozenset[str], packages: frozenset[str]) -> None:
        self.modules = modules
        self.packages = packages
        self._handled = modules | packages
        self.owner = threading.get_ident()
        self.active = True
        self.record = DeferralRecord()
        self._delegating = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if (not self.active or self._delegating or threading.get_ident() != self.owner
                or fullname not in self._handled):
            return None
        spec = self._real_spec(fullname, path, target)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec  # not found, namespace package, extension or zip: import as usual
        if fullname in self.packages:
            plan = reexport_plan(fullname, spec.loader.get_source(fullname) or "")
            if plan is None:
                return spec
            spec.loader = _ReexportLoader(spec.loader, plan)
            self.record.reexported.append(fullname)
        else:
            spec.loader = _DeferredLoader(spec.loader)
            self.record.deferred.append(fullname)
        return spec

    def _real_spec(self, fullname: str, path: Any, target: Any) -> Any:
        """The spec the rest of ``sys.meta_path`` gives (this finder stepping aside)."""
        self._delegating = True
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    return spec
            return None
        finally:
            self._delegating = False


class _PendingBody:
    """A deferred module's ``__getattr__``: runs the real body once, then answers from it.

    The body runs in the module object the import system already handed out, under a lock:
    another thread asking meanwhile waits; the body's own lookups of names it has not bound
    yet get ``AttributeError``, as in any module being initialised.
    """

    def __init__(self, module: ModuleType, run: Callable[[], None]) -> None:
        self.module = module
        self.run = run
        self.started = False
        self._lock = threading.RLock()
        self._runner: int | None = None

    def __call__(self, name: str) -> Any:
        if self._runner == threading.get_ident():
            raise AttributeError(f"partially initialized module {self.module.__name__!r} "
                                 f"has no attribute {name!r}")
        self.complete()
        return getattr(self.module, name)

    def complete(self) -> None:
        """Run the body if nobody has (a failure removes the module, as a failed import does)."""
        with self._lock:
            if self.started:
                return
            self.started, self._runner = True, threading.get_ident()
            try:
                self.run()
            except BaseException:
                if sys.modules.get(self.module.__name__) is self.module:
                    del sys.modules[self.module.__name__]
                raise
            finally:
                self._runner = None
                _remove_hooks(self.module, self)

    def dir(self) -> list[str]:
        self.complete()
        return sorted(self.module.__dict__)


def _install_hooks(module: ModuleType, pending: _PendingBody) -> None:
    module.__dict__["__getattr__"] = pending
    module.__dict__["__dir__"] = pending.dir


def _remove_hooks(module: ModuleType, pending: _PendingBody) -> None:
    """Drop this deferral's hooks unless the body replaced them with its own."""
    namespace = module.__dict__
    hook = namespace.get("__getattr__")
    if hook is pending or getattr(hook, "full", None) is pending:
        del namespace["__getattr__"]
    if getattr(namespace.get("__dir__"), "__self__", None) is pending:
        del namespace["__dir__"]


class _DeferredLoader(importlib.abc.Loader):
    """Creates the module as the real loader would; its body waits for the first lookup."""

    def __init__(self, real: importlib.machinery.SourceFileLoader) -> None:
        self.real = real

    def create_module(self, spec: Any) -> None:
        return None  # the default module object, like the real source loader

    def exec_module(self, module: ModuleType) -> None:
        _restore_loader(module, self.real)
        real = self.real
        _install_hooks(module, _PendingBody(module, lambda: real.exec_module(module)))


def _restore_loader(module: ModuleType, real: importlib.machinery.SourceFileLoader) -> None:
    """The module names its real loader (``reload``, ``inspect``, resources keep working)."""
    module.__loader__ = real
    if module.__spec__ is not None:
        module.__spec__.loader = real


class ReexportPlan(NamedTuple):
    """What a re-export-only ``__init__`` binds: literals, and names -> (submodule, attr)."""

    literals: dict[str, Any]
    names: dict[str, tuple[str, str | None]]


def reexport_plan(package: str, source: str) -> ReexportPlan | None:
    """The plan of ``package``'s ``__init__`` source, or None unless it only re-exports.

    Accepted statements: a docstring, ``from __future__ import ...``, ``NAME = <literal>``
    and ``from .sub import a, b as c`` / ``from . import sub``; anything else (a call, a
    star import, a conditional) may have effects a partial import would skip.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    literals: dict[str, Any] = {"__doc__": ast.get_docstring(tree, clean=False)}
    names: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if not _add_statement(node, package, literals, names):
            return None
    return ReexportPlan(literals, names)


def _add_statement(node: ast.stmt, package: str, literals: dict[str, Any],
                   names: dict[str, tuple[str, str | None]]) -> bool:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True  # docstring
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "__future__":
        return True
    if isinstance(node, ast.ImportFrom) and node.level == 1:
        if any(alias.name == "*" for alias in node.names):
            return False
        for alias in node.names:
            bound = alias.asname or alias.name
            if node.module is None:  # from . import sub
                names[bound] = (f"{package}.{alias.name}", None)
            else:
                names[bound] = (f"{package}.{node.module}", alias.name)
        return True
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)):
        try:
            literals[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            return False
        return True
    return False


class _ReexportLoader(importlib.abc.Loader):
    """The package binds its literals now; each re-exported name imports its submodule on
    first lookup; any other lookup runs the real ``__init__`` in place."""

    def __init__(self, real: importlib.machinery.SourceFileLoader, plan: ReexportPlan) -> None:
        self.real = real
        self.plan = plan

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        _restore_loader(module, self.real)
        module.__dict__.update(self.plan.literals)
        full = _PendingBody(module, lambda: self.real.exec_module(module))
        module.__dict__["__getattr__"] = _ReexportedName(module, self.plan, full)
        module.__dict__["__dir__"] = full.dir


class _ReexportedName:
    """A re-export package's ``__getattr__``: one submodule per known name, else the whole
    ``__init__`` (after which this hook is gone and the package is the real one)."""

    def __init__(self, module: ModuleType, plan: ReexportPlan, full: _PendingBody) -> None:
        self.module = module
        self.plan = plan
        self.full = full

    def __call__(self, name: str) -> Any:
        target = self.plan.names.get(name)
        if target is None or self.full.started:
            return self._whole(name)
        submodule, attribute = target
        value = importlib.import_module(submodule)
        if attribute is not None:
            value = getattr(value, attribute)
        self.module.__dict__[name] = value
        return value

    def _whole(self, name: str) -> Any:
        namespace = self.module.__dict__
        if namespace.get("__getattr__") is self:
            namespace["__getattr__"] = self.full  # so the body's own lookups behave as usual
        return self.full(name)
