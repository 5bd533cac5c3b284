"""Import model source from verified bytes under a content-addressed module name.

The bytes executed are exactly the bytes that were hashed (no re-read from disk), the main
module is named ``qkan_pack_model_<sha256 prefix>`` so two artifacts never collide, and
``--include``d helper modules are served from memory while the model imports, then moved
under the content-addressed name so a user's own modules of the same name are untouched.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import linecache
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from ..errors import ModelSourceError
from ._deferred_imports import deferred_imports
from ._includes import refuse_shadowing

_IMPORT_LOCK = threading.RLock()
#: Source names given to ``linecache`` (``register_source_lines``) with their lines; None
#: for a name dropped because two artifacts' sources shared it.
_REGISTERED_LINES: dict[str, list[str] | None] = {}
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # qkan_pack/


def referenced_modules(module: ModuleType, model: Any) -> dict[str, ModuleType]:
    """The modules a model's own code refers to, by the name their classes carry in
    ``__module__``: the source module and its includes, the modules it imported or took
    classes and functions from, and those defining its model's submodule classes.

    Why: the packages recorded with an artifact are theirs, and an output class is accepted
    at load only when one of them defines it or names it (never from a name the manifest
    alone supplies). Namespaces are read with ``vars``, so no lazy module's ``__getattr__``
    runs; an include is found under the source module, where it lives once imported, before
    a host module of the same name.
    """
    owner = module.__name__
    names = {owner} | {n[len(owner) + 1:] for n in list(sys.modules) if n.startswith(owner + ".")}
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str):
            names.add(name)
    names.update(type(submodule).__module__ for submodule in model.modules())
    found = {}
    for name in sorted(names):
        candidate = sys.modules.get(f"{owner}.{name}") or sys.modules.get(name)
        if isinstance(candidate, ModuleType):
            found[name] = candidate
    return found


def module_name_for(path: str) -> str:
    """``pkg/__init__.py`` -> ``pkg``; ``pkg/util.py`` -> ``pkg.util``; ``helpers.py`` -> ``helpers``."""
    stem = path[: -len(".py")] if path.endswith(".py") else path
    parts = stem.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def content_name(sources: Mapping[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(sources):
        digest.update(path.encode() + b"\0" + sources[path] + b"\0")
    return f"qkan_pack_model_{digest.hexdigest()[:16]}"


class _MemoryFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve the artifact's include modules from verified bytes."""

    def __init__(self, modules: Mapping[str, tuple[str, bytes]]) -> None:
        self.modules = modules  # module name -> (artifact path, source bytes)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.modules:
            return None
        origin, _ = self.modules[fullname]
        is_package = origin.endswith("__init__.py")
        return importlib.machinery.ModuleSpec(fullname, self, origin=origin, is_package=is_package)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        origin, data = self.modules[module.__name__]
        if origin.endswith("__init__.py"):
            module.__path__ = []  # type: ignore[attr-defined]
        register_source_lines(origin, data)
        exec(compile(data, origin, "exec", dont_inherit=True), module.__dict__)


def register_source_lines(filename: str, source: bytes) -> None:
    """Give ``linecache`` the verified source under the name its code objects carry: at
    load that name (``source/model.py``) is no file on disk, and what reads source through
    ``inspect`` — ``torch.jit.script`` in a factory, tracebacks — found nothing.

    Two artifacts whose sources share a name but not their lines make the name ambiguous:
    it is dropped for good, so that nothing ever reads one artifact's lines for another's
    code (TorchScript would compile the wrong function); their source reads then fail as
    before, loudly."""
    lines = source.decode("utf-8", errors="replace").splitlines(keepends=True)
    with _IMPORT_LOCK:
        if filename in _REGISTERED_LINES and _REGISTERED_LINES[filename] != lines:
            _REGISTERED_LINES[filename] = None  # ambiguous for good
            linecache.cache.pop(filename, None)
            return
        _REGISTERED_LINES[filename] = lines
        linecache.cache[filename] = (len(source), None, lines, filename)  # no mtime: kept


def import_model_source(source: str, sources: Mapping[str, bytes], *,
                        display_path: str | None = None) -> ModuleType:
    """Execute ``sources[source]`` as a fresh module; include modules resolve from ``sources``.

    ``display_path`` names the file in error messages (the user's path at build time).
    """
    name = content_name(sources)
    shown = display_path or source
    with _IMPORT_LOCK:
        if name in sys.modules:
            return sys.modules[name]
        base = source.rpartition("/")[0]  # includes import relative to the model file's folder
        includes = {module_name_for(p.removeprefix(f"{base}/") if base else p): (p, data)
                    for p, data in sources.items() if p != source}
        refuse_shadowing(((m, p, data) for m, (p, data) in includes.items()), shown)
        module = ModuleType(name)
        module.__file__ = shown
        # in sys.modules while it runs, as importlib does: dataclasses, typing and pickle
        # look classes' modules up there
        sys.modules[name] = module
        try:
            with _serving(includes, name), deferred_imports():  # heavy unused imports wait
                if display_path is None:  # at build the user's file is on disk as it is
                    register_source_lines(shown, sources[source])
                _execute(sources[source], shown, module)
        except BaseException:
            for imported in [n for n in sys.modules if n == name or n.startswith(name + ".")]:
                del sys.modules[imported]  # the includes it re-homed under it go too
            raise
        return module


def _execute(source: bytes, shown: str, module: ModuleType) -> None:
    """Run the model source in ``module``; what it raises (``sys.exit`` included) is a model
    error naming the import, while Ctrl-C stays ``KeyboardInterrupt``."""
    try:
        # dont_inherit: the user's file gets its own __future__ flags, not this one's
        # (inherited `annotations` turned a dataclass's `y: Tensor` into a string)
        exec(compile(source, shown, "exec", dont_inherit=True), module.__dict__)
    except SyntaxError as exc:
        raise ModelSourceError(f"{shown}: syntax error at line {exc.lineno}: {exc.msg}",
                               stage="import", path=shown) from exc
    except (Exception, SystemExit) as exc:
        raise model_code_failed("import", shown, "import", exc) from exc


@contextmanager
def _serving(includes: Mapping[str, tuple[str, bytes]], owner: str) -> Iterator[None]:
    """Expose include modules by plain name during import, then re-home them under owner."""
    if not includes:
        yield
        return
    shadowed = {n: sys.modules.pop(n) for n in list(sys.modules) if _is_include(n, includes)}
    finder = _MemoryFinder(includes)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for module_name in [n for n in list(sys.modules) if _is_include(n, includes)]:
            sys.modules[f"{owner}.{module_name}"] = sys.modules.pop(module_name)
        sys.modules.update(shadowed)


def _is_include(name: str, includes: Mapping[str, Any]) -> bool:
    return name in includes or any(name.startswith(n + ".") for n in includes)


def check_entry_named(entry: str, sources: Mapping[str, bytes], shown: str) -> None:
    """Refuse, before running anything, an entry whose name appears in none of the sources.

    A cheap textual test (no import, no parse): a factory the module can define names itself.
    """
    pattern = re.compile(rb"\b" + re.escape(entry.encode()) + rb"\b")
    if not any(pattern.search(data) for data in sources.values()):
        raise ModelSourceError(
            f"{shown} never mentions the entry {entry}(): the manifest names a factory the "
            "source does not define; rebuild the artifact (or pass the right --entry)",
            path=shown)


def entry_function(module: ModuleType, entry: str, shown: str) -> Any:
    factory = getattr(module, entry, None)
    if factory is None:
        raise ModelSourceError(
            f"{shown} defines no {entry}(); define `def {entry}(**config) -> torch.nn.Module` "
            "or pass --entry NAME", path=shown)
    if not callable(factory):
        raise ModelSourceError(f"{shown}: {entry} is not callable", path=shown)
    return factory


def accepts_device(factory: Any) -> bool:
    """Whether the factory takes a ``device`` argument (then the target device is passed)."""
    try:
        return "device" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def call_factory(factory: Any, config: Mapping[str, Any], shown: str, entry: str,
                 device: str | None) -> Any:
    """Call the entry with the recorded config (+ device when it accepts one)."""
    import torch

    kwargs = dict(config)
    if device is not None and accepts_device(factory) and "device" not in kwargs:
        kwargs["device"] = device
    try:
        model = factory(**kwargs)
    except (Exception, SystemExit) as exc:  # Ctrl-C stays KeyboardInterrupt
        raise model_code_failed("factory", shown, f"{entry}(**config)", exc) from exc
    if not isinstance(model, torch.nn.Module):
        raise ModelSourceError(
            f"{shown}: {entry}() returned {type(model).__name__}, expected a torch.nn.Module",
            stage="factory", path=shown)
    return model


def model_code_failed(stage: str, shown: str, what: str, exc: BaseException) -> ModelSourceError:
    """The one error for model code that raised: the stage, the file, what ran, the cause."""
    return ModelSourceError(f"{shown}: {what} failed ({stage}): {describe(exc)}", stage=stage,
                            path=shown)


def describe(exc: BaseException) -> str:
    """One line naming the exception and where in the user's code it came from."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        filename = os.path.abspath(frame.filename)
        if not filename.startswith(_PACKAGE_DIR) and "site-packages" not in filename:
            where = f" (at {frame.filename}:{frame.lineno})"
            break
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}"
