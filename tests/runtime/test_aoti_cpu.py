"""AOTInductor packages on the CPU: the libraries an ELF file needs, read from its bytes; a
wrapper library that carries libstdc++ statically refused before any loader sees it; the
link pointed at the shared libstdc++ this process has loaded, with inductor's compiler
setting restored after it, a failed compile included; a package a throw-away process
cannot load refused saying why; and (slow: inductor's CPU backend compiles C++) a package
made by the route on a host whose compiler would link libstdc++ statically."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._inductor import config as inductor_config

from qkan_pack.errors import AotiPackageError, PrecompileRefusedError
from qkan_pack.runtime import _aoti, _precompiled
from qkan_pack.runtime._aoti import (
    check_package,
    compile_aoti,
    load_aoti,
    loaded_libstdcxx,
    needed_libraries,
    probe_package,
    shared_libstdcxx_link,
)
from qkan_pack.runtime._compiled import _private_inductor_dir
from qkan_pack.runtime._precompiled import Plan, ShapePlan, TensorRef, compile_graph, load_precompiled

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(autouse=True)
def link_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lasting link directories of each test in a home of its own (torch keeps the
    precompiled headers of the slow test's compile in the user's inductor cache, as always)."""
    home = tmp_path_factory.mktemp("cache") / "qkan-pack-link"
    monkeypatch.setattr(_aoti, "_link_home", lambda: home)
    return home

#: A library that uses libstdc++ (an exception thrown), as every AOTInductor wrapper does.
SOURCE = '#include <stdexcept>\nextern "C" void f() { throw std::runtime_error("x"); }\n'


def _library(folder: Path, name: str, *flags: str, compiler: str = "g++") -> bytes:
    (folder / "f.cpp").write_text(SOURCE)
    subprocess.run(
        [compiler, "-shared", "-fPIC", *flags, str(folder / "f.cpp"), "-o", str(folder / name)],
        check=True,
        capture_output=True,
    )
    return (folder / name).read_bytes()


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The same code linked against the shared libstdc++ and with its static archive."""
    folder = tmp_path_factory.mktemp("libraries")
    return {
        "shared": _library(folder, "shared.so"),
        "static": _library(folder, "static.so", "-static-libstdc++"),
    }


@pytest.fixture
def static_compiler(tmp_path: Path) -> str:
    """A compiler that links libstdc++ statically unless told otherwise, as the host that
    crashed did: g++ with ``-L`` of a directory holding only libstdc++'s archive after the
    command's own options (where torch's link directories are)."""
    archive = subprocess.run(
        ["g++", "-print-file-name=libstdc++.a"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.path.isabs(archive):
        pytest.skip("g++ has no libstdc++.a to link statically")
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "libstdc++.a").symlink_to(archive)
    script = tmp_path / "bin" / "g++"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nexec g++ "$@" -L{tmp_path / "static"}\n')
    script.chmod(0o700)
    return str(script)


def _package(library: bytes, name: str = "c0.wrapper.so") -> bytes:
    """A package holding ``library`` where AOTInductor puts its wrapper library."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("graph/archive_format", "pt2")
        archive.writestr(f"graph/data/aotinductor/model/{name}", library)
    return buffer.getvalue()


def test_the_needed_libraries_are_read_from_the_bytes(libraries: dict[str, bytes]) -> None:
    shared, static = needed_libraries(libraries["shared"]), needed_libraries(libraries["static"])
    assert shared[0] == "libstdc++.so.6" and "libgcc_s.so.1" in shared  # as readelf -d lists
    assert not any(name.startswith("libstdc++") for name in static) and "libc.so.6" in static
    for broken in (b"", b"MZ" + bytes(100), b"\x7fELF\x02\x01" + bytes(100), libraries["shared"][:4000]):
        with pytest.raises(ValueError):
            needed_libraries(broken)


def test_a_wrapper_carrying_libstdcxx_statically_is_refused_before_torchs_loader(
    libraries: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", lambda path, *args: opened.append(path))
    check_package(_package(libraries["shared"]))
    with pytest.raises(AotiPackageError) as refused:
        load_aoti(_package(libraries["static"]), "cpu")
    error = refused.value
    assert (error.problem, error.library) == ("static libstdc++", "c0.wrapper.so")
    assert "libgcc_s.so.1" in error.needed and not any("libstdc++" in n for n in error.needed)
    assert str(error).startswith(
        "the AOTInductor package's wrapper library c0.wrapper.so links libstdc++ statically (it needs "
    )
    assert error.reason == str(error) and isinstance(error, PrecompileRefusedError)
    assert opened == []  # refused before torch's loader saw it


def test_a_shipped_plan_with_such_a_package_is_refused_naming_it(libraries: dict[str, bytes]) -> None:
    """What a load of shipped forms gets (``_compiled`` then falls back, saying this)."""
    ref = TensorRef(kind="input", name="0", shape=(2,), dtype="float32")
    plan = Plan(
        torch=torch.__version__,
        device="cpu",
        config={},
        shapes=(ShapePlan(label="2", file="0.pt2", inputs=(ref,), args=(ref,), outputs=(0,), form="aoti"),),
    )
    with pytest.raises(AotiPackageError, match=r"wrapper library c0\.wrapper\.so links libstdc"):
        load_precompiled(
            nn.ReLU(),
            plan.to_json(),
            {"0.pt2": _package(libraries["static"])},
            ["2"],
            torch.device("cpu"),
            {},
        )


def test_what_is_no_package_is_refused_saying_why(libraries: dict[str, bytes]) -> None:
    for data, why in (
        (b"not a package", "BadZipFile"),
        (_package(b"not a library"), "ELFError: Magic number does not match"),
        (_package(libraries["shared"], name="c0.wrapper.txt"), "it holds no wrapper library"),
    ):
        with pytest.raises(AotiPackageError, match="the AOTInductor package cannot be read") as refused:
            load_aoti(data, "cpu")
        assert refused.value.problem == "unreadable" and why in refused.value.detail


def test_a_package_torchs_loader_refuses_is_refused_saying_why(libraries: dict[str, bytes]) -> None:
    with pytest.raises(PrecompileRefusedError, match="this torch cannot load the AOTInductor package"):
        load_aoti(_package(libraries["shared"]), "cpu")


def test_aotinductors_refusal_gives_the_graph_inductors_form_with_the_reason(
    libraries: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def static(*args: object) -> bytes:
        data = _package(libraries["static"])
        check_package(data)
        return data

    monkeypatch.setattr(_precompiled, "makes_aoti", lambda device: True)
    monkeypatch.setattr(_precompiled, "compile_aoti", static)
    monkeypatch.setattr(_precompiled, "compile_inductor", lambda gm, example: b"inductor's")
    monkeypatch.setattr(_precompiled, "_callable", lambda data: ("loaded", data))
    made = compile_graph(torch.fx.symbolic_trace(nn.ReLU()), [torch.ones(1)], "cuda:0")
    assert (made.form, made.data) == ("inductor", b"inductor's")
    assert made.aoti_refused.startswith(
        "the AOTInductor package's wrapper library c0.wrapper.so links libstdc++ statically"
    )


def test_the_link_finds_the_loaded_shared_libstdcxx_first(static_compiler: str, tmp_path: Path) -> None:
    """Under a compiler that links libstdc++ statically, the compiler inductor is given while
    a package compiles links the libstdc++.so.6 this process has loaded."""
    loaded = loaded_libstdcxx()
    assert os.path.basename(loaded).startswith("libstdc++.so.6") and os.path.isfile(loaded)
    assert "libstdc++.so.6" not in needed_libraries(_library(tmp_path, "before.so", compiler=static_compiler))
    with inductor_config.patch({"cpp.cxx": (static_compiler,)}), shared_libstdcxx_link() as private:
        compiler = str(inductor_config.cpp.cxx[0])
        assert len(inductor_config.cpp.cxx) == 1
        assert os.path.basename(compiler) == "g++"  # inductor tells gcc from clang by the name
        assert Path(compiler).is_relative_to(private)
        assert os.path.realpath(private / "lib" / "libstdc++.so") == os.path.realpath(loaded)
        linked = needed_libraries(_library(tmp_path, "linked.so", compiler=compiler))
    assert "libstdc++.so.6" in linked


def test_the_compiler_setting_is_restored_after_a_failing_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[tuple[str | None, ...], bool]] = []

    def fail(program: object, package_path: str) -> str:
        seen.append((tuple(inductor_config.cpp.cxx), inductor_config.aot_inductor.precompile_headers))
        assert os.access(str(seen[0][0][0]), os.X_OK)
        raise RuntimeError("the C++ compiler failed")

    headers = inductor_config.aot_inductor.precompile_headers
    before, environment = tuple(inductor_config.cpp.cxx), dict(os.environ)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fail)
    with pytest.raises(RuntimeError, match="the C\\+\\+ compiler failed"):
        compile_aoti(torch.fx.symbolic_trace(nn.ReLU()), [torch.ones(2)], "cpu")
    (compiler, headers_then), = seen
    assert compiler != before and Path(str(compiler[0])).is_relative_to(_aoti._link_home())
    assert headers_then == headers  # torch's own setting: the compiler's path lasts
    assert tuple(inductor_config.cpp.cxx) == before
    assert dict(os.environ) == environment


def test_every_compile_runs_the_compiler_at_one_lasting_path(static_compiler: str) -> None:
    """Torch keys precompiled headers by the compiler's path: one path for every package
    (and process) makes them once, where a new one each time left another ~280 MB set."""
    seen = []
    for _ in range(2):
        with inductor_config.patch({"cpp.cxx": (static_compiler,)}), shared_libstdcxx_link() as folder:
            headers = inductor_config.aot_inductor.precompile_headers
            seen.append((folder, tuple(inductor_config.cpp.cxx), headers))
    assert seen[0] == seen[1]
    folder, (compiler,), headers = seen[0]
    assert folder.parent == _aoti._link_home() and headers is True
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == [
        "bin", "bin/g++", "lib", "lib/libstdc++.so"]
    assert os.stat(folder).st_mode & 0o777 == 0o700 and os.stat(compiler).st_mode & 0o777 == 0o700


def test_a_lasting_directory_that_differs_is_made_again(static_compiler: str) -> None:
    with inductor_config.patch({"cpp.cxx": (static_compiler,)}), shared_libstdcxx_link() as folder:
        (compiler,) = inductor_config.cpp.cxx
    Path(compiler).write_text("#!/bin/sh\nexec /bin/false\n")  # changed behind our back
    (folder / "lib" / "extra.so").write_bytes(b"")
    with inductor_config.patch({"cpp.cxx": (static_compiler,)}), shared_libstdcxx_link() as again:
        assert again == folder and (compiler,) == tuple(inductor_config.cpp.cxx)
        assert f"-L{folder / 'lib'}" in Path(compiler).read_text()
        assert os.listdir(folder / "lib") == ["libstdc++.so"]
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging left


def test_where_the_lasting_home_is_not_ours_alone_a_temporary_one_serves(
    static_compiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user who may write there could change the compiler the script runs."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(_aoti, "_link_home", lambda: shared / "qkan-pack-link")
    with inductor_config.patch({"cpp.cxx": (static_compiler,)}), shared_libstdcxx_link() as folder:
        assert not folder.is_relative_to(shared) and folder.name.startswith("qkan-pack-link-")
        # a passing path: precompiled headers would be made and left at each one
        assert inductor_config.aot_inductor.precompile_headers is False
        linked = needed_libraries(_library(tmp_path, "linked.so", compiler=str(inductor_config.cpp.cxx[0])))
    assert "libstdc++.so.6" in linked and not folder.exists()


@pytest.mark.parametrize(
    ("probe", "said"),
    [
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
            "died of SIGSEGV: Fatal Python error: Segmentation fault",
        ),
        ("import sys\nsys.exit('no such device')", "exited with 1: no such device"),
    ],
)
def test_a_package_a_throw_away_process_cannot_load_is_refused_saying_why(
    probe: str, said: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_aoti, "_PROBE", probe)
    with pytest.raises(AotiPackageError) as refused:
        probe_package(str(tmp_path / "graph.pt2"), "cpu", [torch.ones(2, 3)])
    assert (refused.value.problem, refused.value.detail) == ("child load", said)
    assert str(refused.value) == f"a throw-away process loading and running the AOTInductor package {said}"


def test_a_failed_throw_away_load_leaves_nothing_in_the_temporary_directory(
    libraries: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's loader extracts a package under TMPDIR and leaves it there when the load
    fails: the throw-away process's TMPDIR is a directory of ours, removed afterwards."""
    import tempfile

    (tmp_path / "graph.pt2").write_bytes(_package(libraries["shared"]))  # extracts, then fails
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    with pytest.raises(AotiPackageError, match="exited with 1"):
        probe_package(str(tmp_path / "graph.pt2"), "cpu", [torch.ones(2, 3)])
    assert list(temporary.iterdir()) == []


def test_the_throw_away_process_loads_with_torchs_loader(tmp_path: Path) -> None:
    """The real probe on a file that is no package: torch's loader refuses it there."""
    (tmp_path / "graph.pt2").write_bytes(b"not a package")
    with pytest.raises(AotiPackageError, match=r"exited with 1: RuntimeError: .*") as refused:
        probe_package(str(tmp_path / "graph.pt2"), "cpu", [torch.ones(2, 3)])
    assert refused.value.problem == "child load"


@pytest.mark.slow
def test_a_package_made_by_the_route_links_the_shared_libstdcxx(static_compiler: str) -> None:
    """On a host whose compiler links libstdc++ statically (a plain AOTInductor compile's
    wrapper carries it, and is refused), the route's package needs libstdc++.so.6, passes
    the throw-away load, and runs here as eager does."""
    import torch._inductor

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(3, 4)
    gm = torch.fx.symbolic_trace(model)
    with _private_inductor_dir() as private, inductor_config.patch({"cpp.cxx": (static_compiler,)}):
        plain = Path(private, "plain.pt2")
        with torch.no_grad():
            program = torch.export.export(gm, (x,), strict=False)
        torch._inductor.aoti_compile_and_package(program, package_path=str(plain))
        with pytest.raises(AotiPackageError, match="links libstdc\\+\\+ statically"):
            check_package(plain.read_bytes())
        data, _ = compile_aoti(gm, [x], "cpu")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        (wrapper,) = [name for name in archive.namelist() if name.endswith(".so")]
        assert "libstdc++.so.6" in needed_libraries(archive.read(wrapper))
    with torch.no_grad():
        (got,) = load_aoti(data, "cpu")(x)
        torch.testing.assert_close(got, model(x))


def _make_and_keep(home: str, barrier: Any, answers: Any) -> None:
    """One of several processes making the lasting directory at once, then compiling with
    it (the script must stay in place while it does)."""
    import time

    _aoti._link_home = lambda: Path(home)  # a forked child of the test
    compiler, library = shutil.which("g++") or "g++", loaded_libstdcxx()
    barrier.wait()
    folder = _aoti._lasting_link_dir(compiler, library)
    vanished = False
    if folder is not None:
        script, until = folder / "bin" / os.path.basename(compiler), time.monotonic() + 0.05
        while time.monotonic() < until:
            vanished |= not os.access(script, os.X_OK)
    answers.put((folder is None, vanished))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks its makers")
def test_makers_racing_each_get_the_lasting_directory_and_none_removes_it_in_use(tmp_path: Path) -> None:
    """Four processes at once, thirty times: a maker removed the directory another had just
    checked and was compiling with (it then linked without the link, or fell back)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    outcomes = []
    for round_ in range(30):
        home = tmp_path / str(round_) / "qkan-pack-link"
        home.parent.mkdir(mode=0o700)
        barrier, answers = context.Barrier(4), context.Queue()
        makers = [context.Process(target=_make_and_keep, args=(str(home), barrier, answers))
                  for _ in range(4)]
        for maker in makers:
            maker.start()
        outcomes += [answers.get(timeout=60) for _ in makers]
        for maker in makers:
            maker.join(timeout=60)
        assert [p.name for p in home.iterdir()] == [next(home.iterdir()).name]  # no staging left
    assert outcomes == [(False, False)] * 120


@pytest.mark.parametrize("name", ["with space", "o'brien"])
def test_a_home_torchs_command_line_would_split_serves_a_temporary_directory(
        name: str, static_compiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch joins the compiler's path into a command string and splits it again: a space
    or quote in the path (the user's name is in it) broke every compile."""
    home = tmp_path / name / "qkan-pack-link"
    home.parent.mkdir(mode=0o700)
    monkeypatch.setattr(_aoti, "_link_home", lambda: home)
    with inductor_config.patch({"cpp.cxx": (static_compiler,)}), shared_libstdcxx_link() as folder:
        assert not folder.is_relative_to(home) and not home.exists()
        assert inductor_config.aot_inductor.precompile_headers is False
