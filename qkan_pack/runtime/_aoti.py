"""AOTInductor packages: compiled so that they link the shared libstdc++, refused when they
would crash the process that loads them, and run by torch's C++ loader.

Why: every torch process has the shared libstdc++ (``libstdc++.so.6``, which libtorch needs)
loaded. A package whose wrapper library was linked with libstdc++'s static archive carries a
second copy of libstdc++; the first ``std::regex`` the wrapper compiles (``parse_device_str``,
in the model container's constructor) runs that copy's locale code against the process's,
and the process dies of a segmentation fault, where no fallback can catch it. Whether a link
takes the archive depends on the compiler installation of the host that compiles (a host
with g++ 13 and torch 2.11 did, the same torch's packages linked the shared library once the
compiler was pointed at it), so three things hold it off here:

- ``shared_libstdcxx_link``: while a package compiles, the link finds a ``libstdc++.so`` for
  the very ``libstdc++.so.6`` this process has loaded, ahead of every other directory.
- ``check_package``: a package whose wrapper library does not need ``libstdc++.so.6`` is
  refused (``AotiPackageError``) before it is recorded, and again before a load hands a
  shipped one to torch's loader; its ``DT_NEEDED`` entries are read from the bytes
  (pyelftools), nothing is loaded.
- ``probe_package``: where forms are made, each package is first loaded and run once in a
  throw-away process (bounded in time), so that a crash of any other cause refuses the
  form instead of killing the process that made it.

A refused package costs the graph its AOTInductor form only: ``_precompiled`` makes
inductor's form for it instead, and a load that refuses a shipped one falls back as for
any refused precompiled graph (``_compiled``).

Not owned here: choosing forms, plans and files (``_precompiled``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import AotiPackageError, PrecompileRefusedError

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

#: The soname a wrapper library must need: the shared libstdc++ torch itself runs with.
SHARED_LIBSTDCXX = "libstdc++.so.6"
#: A throw-away load that takes longer is taken as failing (a GPU's context included).
PROBE_TIMEOUT_S = 300

#: The throw-away process: loads the package at argv[1] on argv[2] as ``load_package`` does
#: and runs it once on zeros of the graph's input shapes, dtypes and strides (argv[3]).
_PROBE = """
import json, sys
import torch
path, device, inputs = sys.argv[1], torch.device(sys.argv[2]), json.loads(sys.argv[3])
loader = torch._C._aoti.AOTIModelPackageLoader(
    path, "model", True, 1, -1 if device.index is None else device.index)
args = [torch.empty_strided(shape, stride, dtype=getattr(torch, dtype), device=device).zero_()
        for shape, stride, dtype in inputs]
loader.boxed_run(args)
if device.type == "cuda":
    torch.cuda.synchronize(device)
"""


def needed_libraries(data: bytes) -> tuple[str, ...]:
    """The sonames an ELF shared library needs (its ``DT_NEEDED`` entries, in order), read
    from its bytes by pyelftools without loading it: a library that would crash the process
    is refused before it is loaded. ``ValueError`` for anything that is not such a library."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(data))
        dynamic = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
        if dynamic is None:
            raise ValueError("no dynamic section: not a shared library")
        # pyelftools names each tag's string by its kind, as an attribute set per tag
        return tuple(tag.needed for tag in dynamic.iter_tags("DT_NEEDED"))  # type: ignore[attr-defined]
    except ValueError:
        raise
    except Exception as exc:  # ELFError, and struct or lookup errors of a truncated file
        raise ValueError(f"not a readable ELF shared library ({type(exc).__name__}: {exc})") from None


def loaded_libstdcxx() -> str:
    """The file of the shared libstdc++ mapped into this process (torch's, loaded with
    libtorch), found in ``/proc/self/maps``; loaded by its soname first if it is not."""
    found = _mapped_libstdcxx()
    if found is None:
        try:
            ctypes.CDLL(SHARED_LIBSTDCXX)
        except OSError as exc:
            raise PrecompileRefusedError(
                f"this process cannot load {SHARED_LIBSTDCXX} for an AOTInductor package to link ({exc})"
            ) from exc
        found = _mapped_libstdcxx()
    if found is None:
        raise PrecompileRefusedError(
            f"no {SHARED_LIBSTDCXX} is mapped into this process "
            "(/proc/self/maps) for an AOTInductor package to link"
        )
    return found


def _mapped_libstdcxx() -> str | None:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) == 6 else ""
        if os.path.basename(path).startswith("libstdc++.so") and os.path.isfile(path):
            return path
    return None


@contextlib.contextmanager
def shared_libstdcxx_link() -> Iterator[Path]:
    """While the body compiles a package, inductor's C++ compiler is a script of ours that
    runs the compiler inductor would have used with ``-L`` of a directory of ours first on
    its command line; that directory holds only ``libstdc++.so``, a link to the
    ``libstdc++.so.6`` this process has loaded (``loaded_libstdcxx``). The linker takes a
    library from the first directory that holds it, so the wrapper links that shared
    library (and needs ``libstdc++.so.6``), whatever archives the host's other directories
    hold. Yields the directory holding the script (``bin/``) and the link (``lib/``).

    Why a compiler script: torch's inductor has no setting for extra link directories or
    flags (in 2.13, ``cpp_builder`` takes its link options from torch alone, and
    ``aot_inductor.aoti_shim_library_path`` applies to Windows cross-compiles only), but it
    takes the compiler from the setting ``cpp.cxx``, which on torch 2.11 governs the
    package's link too (``CXX`` seeds it: a script adding such a ``-L`` made the packages of
    the host that crashed link the shared library). ``LIBRARY_PATH`` would need no script,
    but gcc searches it after its own library directories (``g++ -v`` lists them first), so
    an archive there would still win; a ``-L`` is searched before them.

    Why one lasting directory per compiler and library (``_lasting_link_dir``, beside
    torch's precompiled headers in the user's inductor cache): torch keys a compile's
    precompiled headers by the compiler's path, so at one path they are made by the first
    package and reused by every later one, as for any AOTInductor user, where a new path
    per package made and left another ~280 MB set each time. Where that directory cannot
    be ours alone, a temporary one serves, without precompiled headers, removed afterwards.

    Nothing of the process's environment changes: ``cpp.cxx`` is set with torch's
    ``config.patch`` and restored when the body ends, by an exception too. The script keeps
    the compiler's file name (inductor tells gcc from clang by it).
    """
    from torch._inductor import config
    from torch._inductor.cpp_builder import get_cpp_compiler

    library = loaded_libstdcxx()
    compiler = get_cpp_compiler()
    compiler = shutil.which(compiler) or compiler
    patches: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        folder = _lasting_link_dir(compiler, library)
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qkan-pack-link-")))
            _fill_link_dir(folder, compiler, library)
            patches["aot_inductor.precompile_headers"] = False  # keyed by this passing path
        patches["cpp.cxx"] = (str(folder / "bin" / os.path.basename(compiler)),)
        with config.patch(patches):
            yield folder


def _link_home() -> Path:
    """Where the lasting link directories live: beside torch's precompiled headers, in the
    user's inductor cache (``/tmp/torchinductor_<user>``; ``TORCHINDUCTOR_CACHE_DIR`` moves
    neither)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir(), "qkan-pack-link")


def _lasting_link_dir(compiler: str, library: str) -> Path | None:
    """The link directory for this compiler and library at a path that stays the same
    (named by their digest), made once, atomically (filled apart, then renamed into
    place), and checked before each use; ``None`` where it or its home and the home's
    folder are not this user's alone (another user could change the compiler it runs), or
    where its path would not survive torch's command line (it joins the compiler's path
    into a string and splits it again: a space or quote in the user's name breaks it).

    Concurrent makers: a directory in place is never removed while it holds the right
    link (another process may be compiling with it). One that differs is renamed aside
    first, then removed; a rename that loses the race leaves the winner's, used if right."""
    home = _link_home()
    folder = home / hashlib.sha256(f"{compiler}\0{library}".encode()).hexdigest()[:24]
    if not _one_word(str(folder)):
        return None
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    if not (_private(home.parent) and _private(home)):
        return None
    if _holds_link(folder, compiler, library):
        return folder
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=home))
    except OSError:
        return None
    try:
        _fill_link_dir(staging, compiler, library, final=folder)
        _replace_link_dir(staging, folder, compiler, library)
    except OSError:
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone once renamed into place
    return folder if _holds_link(folder, compiler, library) else None


def _one_word(path: str) -> bool:
    """Whether a shell-like split keeps ``path`` whole (no space, quote or backslash)."""
    try:
        return shlex.split(path) == [path]
    except ValueError:  # an unclosed quote
        return False


def _replace_link_dir(staging: Path, folder: Path, compiler: str, library: str) -> None:
    """Rename ``staging`` to ``folder``; where a directory is there already, keep it if it
    holds the right link (another process's), else rename it aside and try once more."""
    try:
        os.rename(staging, folder)
        return
    except OSError:
        if _holds_link(folder, compiler, library) or not os.path.lexists(folder):
            return
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}-old-", dir=folder.parent))
    try:
        os.rename(folder, aside / "old")
        os.rename(staging, folder)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _private(folder: Path) -> bool:
    """Whether ``folder`` is a directory of this user that no one else may write to."""
    try:
        status = os.lstat(folder)
    except OSError:
        return False
    return (stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()
            and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _compiler_script(compiler: str, lib: Path) -> str:
    return f'#!/bin/sh\nexec {shlex.quote(compiler)} {shlex.quote(f"-L{lib}")} "$@"\n'


def _fill_link_dir(folder: Path, compiler: str, library: str, final: Path | None = None) -> None:
    """``lib/libstdc++.so`` linking ``library``, and ``bin/<compiler's name>``: the script
    running ``compiler`` with ``-L`` of that ``lib`` at ``final`` (the path ``folder`` is
    renamed to once filled; ``folder`` itself by default)."""
    final = final or folder
    (folder / "lib").mkdir(mode=0o700)
    (folder / "bin").mkdir(mode=0o700)
    (folder / "lib" / "libstdc++.so").symlink_to(library)
    script = folder / "bin" / os.path.basename(compiler)
    script.write_text(_compiler_script(compiler, final / "lib"))
    script.chmod(0o700)


def _holds_link(folder: Path, compiler: str, library: str) -> bool:
    """Whether ``folder`` is a private link directory for ``compiler`` and ``library``."""
    script = folder / "bin" / os.path.basename(compiler)
    try:
        return (_private(folder) and _private(folder / "bin") and _private(folder / "lib")
                and os.readlink(folder / "lib" / "libstdc++.so") == library
                and script.read_text() == _compiler_script(compiler, folder / "lib")
                and os.lstat(script).st_uid == os.getuid()
                and os.lstat(script).st_mode & 0o777 == 0o700
                and sorted(os.listdir(folder / "bin")) == [script.name]
                and os.listdir(folder / "lib") == ["libstdc++.so"])
    except OSError:
        return False


def check_package(data: bytes) -> None:
    """Refuse (``AotiPackageError``) a package any of whose libraries does not need the
    shared libstdc++, or that holds no library to check."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            libraries = {
                name: archive.read(name)
                for name in archive.namelist()
                if "/data/aotinductor/" in f"/{name}" and name.endswith(".so")
            }
        needs = {name: needed_libraries(library) for name, library in libraries.items()}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise AotiPackageError(problem="unreadable", detail=f"{type(exc).__name__}: {exc}") from None
    if not needs:
        raise AotiPackageError(problem="unreadable", detail="it holds no wrapper library")
    for name, needed in needs.items():
        if not any(soname.startswith("libstdc++.so") for soname in needed):
            raise AotiPackageError(problem="static libstdc++", library=name.rsplit("/", 1)[-1], needed=needed)


def probe_package(path: str, device: str, example: Sequence[torch.Tensor]) -> None:
    """Load and run the package at ``path`` once in a throw-away process; refuse it
    (``AotiPackageError``, the exit or signal and the process's last word) when that fails,
    crashes or takes over ``PROBE_TIMEOUT_S``."""
    inputs = json.dumps(
        [[list(t.shape), list(t.stride()), str(t.dtype).removeprefix("torch.")] for t in example]
    )
    # torch's loader extracts the package under TMPDIR and leaves it there when the load
    # fails or the process dies: the child's is a directory of ours, removed afterwards
    with tempfile.TemporaryDirectory(prefix="qkan-pack-probe-") as scratch:
        try:
            done = subprocess.run(
                [sys.executable, "-c", _PROBE, path, device, inputs],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "PYTHONFAULTHANDLER": "1", "TMPDIR": scratch},
                timeout=PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            done = None
    if done is None:
        raise AotiPackageError(problem="child load", detail=f"took over {PROBE_TIMEOUT_S} s") from None
    if done.returncode == 0:
        return
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    said = next(
        (line for line in lines if line.startswith("Fatal Python error")), lines[-1] if lines else "no output"
    )
    how = (
        f"died of {_signal_name(-done.returncode)}"
        if done.returncode < 0
        else f"exited with {done.returncode}"
    )
    raise AotiPackageError(problem="child load", detail=f"{how}: {said[:200]}")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def compile_aoti(gm: torch.fx.GraphModule, example: list[Any],
                 device: str) -> tuple[bytes, AotiGraph]:
    """The graph as an AOTInductor package (``.pt2`` bytes) for ``device``, and the package
    loaded here: exported with every tensor an input, as traced, so the package holds code
    and no weights; linked against the shared libstdc++, checked, and loaded and run once in
    a throw-away process before anything of it is loaded here."""
    import torch._inductor

    with torch.no_grad():
        program = torch.export.export(gm, tuple(example), strict=False)
    with tempfile.TemporaryDirectory(prefix="qkan-pack-aoti-") as scratch:
        path = os.path.join(scratch, "graph.pt2")
        with shared_libstdcxx_link():
            torch._inductor.aoti_compile_and_package(program, package_path=path)
        data = Path(path).read_bytes()
        check_package(data)
        probe_package(path, device, example)
        return data, _open(path, device)


def load_aoti(data: bytes, device: str) -> AotiGraph:
    """A shipped AOTInductor package run by torch's C++ loader, once ``check_package``
    accepts it. Nothing of inductor's Python is imported."""
    check_package(data)
    with tempfile.TemporaryDirectory(prefix="qkan-pack-aoti-") as scratch:
        path = os.path.join(scratch, "graph.pt2")
        Path(path).write_bytes(data)
        return _open(path, device)


def _open(path: str, device: str) -> AotiGraph:
    """The package at ``path`` loaded by torch's C++ loader, which copies it into a private
    temporary directory of its own (removed when the loader is freed) and loads the library;
    single-threaded, so that it launches on the current stream and a CUDA graph can capture
    it."""
    index = torch.device(device).index
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(
            path, "model", True, 1, -1 if index is None else index
        )
    except Exception as exc:  # another torch's package, a corrupt one, a missing library
        raise PrecompileRefusedError(
            f"this torch cannot load the AOTInductor package ({type(exc).__name__}: {exc})"
        ) from exc
    return AotiGraph(loader)


class AotiGraph:
    """Calls a loaded AOTInductor package with the graph's inputs as the list ``boxed_run``
    takes (and empties); the outputs come back as a list. Holds the loader: the library,
    and the kernels a captured CUDA graph launches, live as long as it does."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        outputs: list[torch.Tensor] = self.loader.boxed_run(list(args))
        return outputs
