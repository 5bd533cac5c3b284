"""Import model source from verified bytes under a content-addressed module name.

The bytes executed are exactly the bytes that were hashed (no re-read from disk), the main
module is named ``qkan_pack_model_<sha256 prefix>`` so two artifacts never collide, and
``--include``d helper modules are served from memory while the model imports, then moved
under the content-addressed name so a user's own modules of the same name are untouched.

Each verified file is compiled under ``<qkan-pack sha256:HEX/PATH>`` (``source_filename``)
and its lines are given to ``linecache`` under that name for as long as a ``SourceLines``
holds them: tracebacks, ``inspect`` and TorchScript read the verified bytes, never a file.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import linecache
import os
import re
import sys
import threading
import tokenize
import traceback
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .._extras import install_hint, missing_module
from ..errors import ModelSourceError
from ._deferred_imports import deferred_imports
from ._includes import refuse_shadowing

if TYPE_CHECKING:
    import torch

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = [
    "accepts_device",
    "call_factory",
    "check_entry_named",
    "content_name",
    "describe",
    "entry_function",
    "import_model_source",
    "model_code_failed",
    "referenced_modules",
]


_IMPORT_LOCK = threading.RLock()
_LINES_LOCK = threading.Lock()  # not re-entrant: see ``_collected``
#: ``linecache`` names of verified sources: (holders, the entry given to linecache).
_HELD_LINES: dict[str, tuple[int, tuple[int, None, list[str], str]]] = {}
#: Modules imported from verified bytes under ``source_filename`` names; only these serve
#: a load (a build's module of the same name was compiled from the user's files).
_VERIFIED_MODULES: weakref.WeakSet[ModuleType] = weakref.WeakSet()
#: Names of holders the garbage collector took while the lock was held (``_collected``).
_COLLECTED: list[set[str]] = []
_SOURCE_NAME = re.compile(r"<qkan-pack sha256:[0-9a-f]{64}/(.*)>", re.DOTALL)
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


def source_filename(path: str, data: bytes) -> str:
    """The name a verified file is compiled under and given to ``linecache`` by:
    ``<qkan-pack sha256:HEX/PATH>``, HEX the sha256 of its bytes (as the manifest records it).

    Tracebacks, ``inspect`` and TorchScript look source up by this name. A plain artifact
    path (``source/model.py``) is one every artifact of that file name shares, and
    ``linecache`` falls back to reading it from the working directory or ``sys.path``; a
    ``<...>`` name is never looked up on disk (``linecache.updatecache`` returns no lines
    for it), and the digest makes it a name only these bytes have: never another
    artifact's, nor a pseudo-file of the host such as ``<string>``.
    """
    return f"<qkan-pack sha256:{hashlib.sha256(data).hexdigest()}/{path}>"


def shown_path(filename: str) -> str:
    """A code object's filename as one-line messages show it: the artifact path for a
    ``source_filename``, anything else as it is."""
    match = _SOURCE_NAME.fullmatch(filename)
    return match.group(1) if match else filename


class SourceLines:
    """A claim on the ``linecache`` entries of verified sources, for as long as their code
    may run: the artifact's while it is rebuilt, then its ``Predictor``'s until ``close``.

    Names are counted across holders: the last release of a name takes it out of
    ``linecache``, and a holder collected unreleased (a predictor dropped without ``close``,
    a failed load) gives back what it held then. The entries carry no mtime, which
    ``linecache.checkcache`` keeps; ``linecache.clearcache`` drops them and the next hold of
    those sources puts them back. Without an entry a source read finds no lines, never a
    file: the names are ``<...>`` pseudo-files.
    """

    def __init__(self) -> None:
        self._names: set[str] = set()
        finalizer = weakref.finalize(self, _collected, self._names)
        finalizer.atexit = False  # at exit there is nothing left to give back

    def hold(self, sources: Mapping[str, bytes]) -> None:
        """Give ``linecache`` each source's lines (again, after a ``clearcache``) and count
        this holder once for each."""
        entries = [_linecache_entry(path, data) for path, data in sources.items()]
        with _LINES_LOCK:
            for entry in entries:
                name = entry[3]
                count, kept = _HELD_LINES.get(name, (0, entry))
                if name not in self._names:
                    self._names.add(name)
                    count += 1
                _HELD_LINES[name] = (count, kept)
                linecache.cache[name] = kept
            _drop_collected()

    def release(self) -> None:
        """Give back every name held (a second call does nothing)."""
        with _LINES_LOCK:
            _drop(self._names)
            _drop_collected()


def _linecache_entry(path: str, data: bytes) -> tuple[int, None, list[str], str]:
    """``(size, mtime, lines, name)`` as ``linecache`` keeps a file; lines split where the
    compiler counts them (form feeds and other separators do not end a line) and decoded
    as the compiler decodes the bytes (a coding declaration is honoured)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        encoding = "utf-8"
    lines = io.StringIO(data.decode(encoding, errors="replace"), newline=None).readlines()
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return (len(data), None, lines, source_filename(path, data))


def _drop(names: set[str]) -> None:
    """Count one holder less for each name (under ``_LINES_LOCK``); the last one out
    removes the entry, unless something else has replaced it in ``linecache`` since."""
    for name in names:
        count, entry = _HELD_LINES.pop(name)
        if count > 1:
            _HELD_LINES[name] = (count - 1, entry)
        elif linecache.cache.get(name) is entry:
            del linecache.cache[name]
    names.clear()


def _collected(names: set[str]) -> None:
    """A holder's finalizer. The garbage collector may run it while this thread is inside
    ``hold``/``release`` (the lock is not re-entrant): it queues the names and drops them
    now only if the lock is free; else the thread holding the lock drops them on its way
    out, or the next ``hold``/``release`` does."""
    _COLLECTED.append(names)
    if _LINES_LOCK.acquire(blocking=False):
        try:
            _drop_collected()
        finally:
            _LINES_LOCK.release()


def _drop_collected() -> None:
    while _COLLECTED:
        _drop(_COLLECTED.pop())


#: Holds the lines of sources imported without a holder of their own, for the process.
_PROCESS_LINES = SourceLines()


class _MemoryFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve the artifact's include modules from their bytes."""

    def __init__(self, modules: Mapping[str, tuple[str, str, bytes]]) -> None:
        self.modules = modules  # module name -> (artifact path, compiled filename, bytes)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.modules:
            return None
        origin, filename, _ = self.modules[fullname]
        is_package = origin.endswith("__init__.py")
        return importlib.machinery.ModuleSpec(fullname, self, origin=filename,
                                              is_package=is_package)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        origin, filename, data = self.modules[module.__name__]
        if origin.endswith("__init__.py"):
            module.__path__ = []
        module.__file__ = filename  # what inspect finds a class's source by
        exec(compile(data, filename, "exec", dont_inherit=True), module.__dict__)


def import_model_source(source: str, sources: Mapping[str, bytes], *,
                        display_path: str | None = None,
                        lines: SourceLines | None = None,
                        packages: Mapping[str, str] | None = None) -> ModuleType:
    """Execute ``sources[source]`` as a fresh module; include modules resolve from ``sources``.

    At load (no ``display_path``) every file is compiled under its ``source_filename`` and
    ``lines`` holds their lines (the artifact's holder, which its ``Predictor`` releases;
    without one they are held for the process). A load reuses only a module that a load
    imported: a build's module of the same name was compiled under the user's paths, whose
    files may have changed since.

    ``display_path`` (a build: the user's path) names the file in error messages, and the
    files are compiled under the user's own paths, which ``linecache`` reads as it reads
    any module the user imports. ``packages``: the versions the artifact recorded, named
    when an import fails for a missing package (``model_code_failed``).
    """
    name = content_name(sources)
    verified = display_path is None
    shown = display_path or source
    base = source.rpartition("/")[0]  # includes import relative to the model file's folder
    if display_path is None:
        filenames = {p: source_filename(p, data) for p, data in sources.items()}
        (lines if lines is not None else _PROCESS_LINES).hold(sources)
    else:
        filenames = {p: _user_path(p, base, display_path) for p in sources}
    with _IMPORT_LOCK:
        cached = sys.modules.get(name)
        if cached is not None and (cached in _VERIFIED_MODULES) == verified:
            return cached
        includes = {module_name_for(p.removeprefix(f"{base}/") if base else p):
                    (p, filenames[p], data) for p, data in sources.items() if p != source}
        refuse_shadowing(((m, p, data) for m, (p, _, data) in includes.items()), shown)
        module = ModuleType(name)
        module.__file__ = filenames[source]
        # in sys.modules while it runs, as importlib does: dataclasses, typing and pickle
        # look classes' modules up there
        sys.modules[name] = module
        try:
            with _serving(includes, name), deferred_imports():  # heavy unused imports wait
                _execute(sources[source], filenames[source], shown, module, packages,
                         beside=None if display_path is None else os.path.dirname(display_path))
        except BaseException:
            for imported in [n for n in sys.modules if n == name or n.startswith(name + ".")]:
                del sys.modules[imported]  # the includes it re-homed under it go too
            raise
        if verified:
            _VERIFIED_MODULES.add(module)
        return module


def _user_path(path: str, base: str, display_path: str) -> str:
    """Where a build read an artifact path from: beside the model file, as ``_read_sources``
    keyed it."""
    return os.path.join(os.path.dirname(display_path), path.removeprefix(f"{base}/"))


def _execute(source: bytes, filename: str, shown: str, module: ModuleType,
             packages: Mapping[str, str] | None = None, beside: str | None = None) -> None:
    """Run the model source in ``module``, compiled under ``filename``; what it raises
    (``sys.exit`` included) is a model error naming the import, while Ctrl-C stays
    ``KeyboardInterrupt``. ``beside``: at a build, the model file's folder (a module missing
    there is a local file to ``--include``)."""
    try:
        # dont_inherit: the user's file gets its own __future__ flags, not this one's
        # (an inherited `annotations` would turn a dataclass's `y: Tensor` into a string)
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)
    except SyntaxError as exc:
        raise ModelSourceError(f"{shown}: syntax error at line {exc.lineno}: {exc.msg}",
                               stage="import", path=shown) from exc
    except (Exception, SystemExit) as exc:
        raise model_code_failed("import", shown, "import", exc, packages, beside) from exc


@contextmanager
def _serving(includes: Mapping[str, tuple[str, str, bytes]], owner: str) -> Iterator[None]:
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
        defined = sorted(name for name, value in vars(module).items()
                         if callable(value) and not name.startswith("_")
                         and getattr(value, "__module__", None) == module.__name__)
        close = difflib.get_close_matches(entry, defined, n=1)
        hint = (f"did you mean {close[0]}()? " if close else "") + (
            f"it defines {', '.join(defined[:8])}; " if defined else "")
        raise ModelSourceError(
            f"{shown} defines no {entry}(); {hint}define `def {entry}(**config) -> "
            "torch.nn.Module` or pass --entry NAME", path=shown)
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
                 device: str | None, beside: str | None = None) -> torch.nn.Module:
    """Call the entry with the recorded config (+ device when it accepts one). ``beside``:
    at a build, the model file's folder (``model_code_failed``)."""
    import torch

    kwargs = dict(config)
    if device is not None and accepts_device(factory) and "device" not in kwargs:
        kwargs["device"] = device
    unknown = _unknown_arguments(factory, kwargs)
    if unknown:
        raise ModelSourceError(f"{shown}: {entry}() takes no argument {unknown}", stage="factory",
                               path=shown)
    try:
        model = factory(**kwargs)
    except (Exception, SystemExit) as exc:  # Ctrl-C stays KeyboardInterrupt
        raise model_code_failed("factory", shown, f"{entry}(**config)", exc,
                                beside=beside) from exc
    if not isinstance(model, torch.nn.Module):
        raise ModelSourceError(
            f"{shown}: {entry}() returned {type(model).__name__}, expected a torch.nn.Module",
            stage="factory", path=shown)
    _refuse_meta_tensors(model, shown, entry)
    return model


def _unknown_arguments(factory: Any, kwargs: Mapping[str, Any]) -> str:
    """A config key the factory's signature does not take, as a message naming what it does
    take (a misspelt ``--config hiden=64`` says ``did you mean hidden?``); "" when all fit or
    the signature takes ``**kwargs`` or cannot be read."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return ""
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return ""
    names = [n for n, p in parameters.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            return f"{key!r}{hint} It takes: {', '.join(names) or 'no arguments'}"
    return ""


def _refuse_meta_tensors(model: Any, shown: str, entry: str) -> None:
    """A tensor on the meta device has no data: loading weights does not fill a
    non-persistent buffer, and moving the model to a device fails on it. Said at build,
    where it can be fixed, not first by a load."""
    tensors = (*model.named_parameters(), *model.named_buffers())
    meta = [name for name, tensor in tensors if tensor.is_meta]
    if meta:
        shown_names = ", ".join(meta[:5]) + (f" and {len(meta) - 5} more" if len(meta) > 5 else "")
        raise ModelSourceError(
            f"{shown}: {entry}() returned a model with tensors on the meta device, which hold "
            f"no data: {shown_names}; create them with data in {entry}() (a non-persistent "
            "buffer is never in the weights: compute it, or module.to_empty(device=...) and "
            "initialise it)", stage="factory", path=shown)


def model_code_failed(stage: str, shown: str, what: str, exc: BaseException,
                      packages: Mapping[str, str] | None = None,
                      beside: str | None = None) -> ModelSourceError:
    """The one error for model code that raised: the stage, the file, what ran, the cause;
    for a module that is not installed, the line that installs it (at the version the
    artifact recorded, given its ``packages``), or, at a build (``beside``: the model file's
    folder), the ``--include`` that packs it when it is a local file or package there."""
    message = f"{shown}: {what} failed ({stage}): {describe(exc)}"
    module = missing_module(exc)
    local = _local_module(module, beside) if module is not None else None
    if local is not None:
        message += (f"; {local} is beside the model, but an artifact holds only the model "
                    f"file and what --include names: build with --include {local}")
    elif module is not None and packages is not None:
        message += f"; the model needs {module}: {install_hint(module, packages)}"
    elif module is not None:
        message += f"; install it: {install_hint(module)}"
    return ModelSourceError(message, stage=stage, path=shown)


def _local_module(module: str, folder: str | None) -> str | None:
    """``folder/module.py``, or ``folder/module`` when it is a package (a folder of Python
    files), as the user would type it; None when neither is there."""
    if folder is None:
        return None
    file, package = os.path.join(folder, f"{module}.py"), os.path.join(folder, module)
    if os.path.isfile(file):
        return file
    if os.path.isdir(package) and any(name.endswith(".py") for name in os.listdir(package)):
        return package
    return None


def describe(exc: BaseException) -> str:
    """One line naming the exception and where in the user's code it came from."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        filename = os.path.abspath(frame.filename)
        if not filename.startswith(_PACKAGE_DIR) and "site-packages" not in filename:
            where = f" (at {shown_path(frame.filename)}:{frame.lineno})"
            break
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}"
