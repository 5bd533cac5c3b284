"""The command line: exit codes (0 ok, 1 error, 2 usage), one-line messages, no torch for
``--help``/``inspect``, and one real ``python -m qkan_pack`` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from qkan_pack import ModelSourceError, read_artifact
from qkan_pack.cli import cli

from .conftest import EXAMPLES, MODELS, ROOT

MLP = str(EXAMPLES / "qkan_mlp.py")


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def one_line_error(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture(autouse=True)
def no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QKAN_PACK_DEBUG", raising=False)


def test_version_names_the_supported_releases_and_what_is_installed() -> None:
    """``--version`` states each range a seam into a library's internals accepts (one place:
    ``qkan_pack._supported``), beside the release installed here."""
    import re
    from importlib import metadata

    from qkan_pack import __version__

    result = run("--version")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"qkan-pack {__version__}"
    shown = {match.group(1): match.group(2) for match in
             re.finditer(r"^  (\S+ \S+)\s+\(([^)]*)\)", result.output, re.MULTILINE)}
    assert list(shown) == ["Triton 3.2–3.7", "Ray 2.60.x", "uvicorn 0.30–0.x", "model-signing 1.1.1"]
    ray = metadata.version("ray")
    assert shown["Ray 2.60.x"] == (ray if ray.startswith("2.60.") else f"{ray}: outside")


@pytest.fixture(scope="module")
def cli_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("cli") / "mlp"
    result = run("build", MLP, "--shapes", "1x2,4x2", "-o", out)
    assert result.exit_code == 0, result.output
    digest = result.stdout.strip().splitlines()[-1].removeprefix("digest ")
    return out, digest


# ---------------------------------------------------------------------------
# Success paths
# ---------------------------------------------------------------------------


def test_build_prints_path_shapes_and_digest(cli_artifact: tuple[Path, str]) -> None:
    path, digest = cli_artifact
    assert digest.startswith("sha256:") and len(digest) == 71
    assert read_artifact(path).digest == digest


def test_inspect_table_shows_digest_shapes_files(cli_artifact: tuple[Path, str]) -> None:
    path, digest = cli_artifact
    result = run("inspect", path)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert f"digest     {digest}" in text and "integrity verified" in text
    # format 2: a manifest without a key of format 3 keeps the version older readers load
    for needle in ("qkan-pack v2", "source/qkan_mlp.py :: build_model", "x: float32", "1x2",
                   "4x2", "weights.safetensors", "references/shape-001.safetensors",
                   "capture    auto", "torch", "f32 noise"):
        assert needle in text, needle
    rows = [line.split() for line in text.splitlines() if line.startswith(("   0  x", "   1  x"))]
    assert [float(row[3]) for row in rows] == [e["noise"] for e in json.loads(
        (path / "manifest.json").read_text())["shapes"]]  # each shape's float32 noise


def test_inspect_json(cli_artifact: tuple[Path, str]) -> None:
    path, digest = cli_artifact
    result = run("inspect", "--json", path)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["digest"] == digest
    assert payload["manifest"]["format"] == "qkan-pack"
    assert [s["inputs"]["x"] for s in payload["manifest"]["shapes"]] == [[1, 2], [4, 2]]


def test_verify_ok(cli_artifact: tuple[Path, str]) -> None:
    path, digest = cli_artifact
    result = run("verify", path, "--expected-digest", digest)
    assert result.exit_code == 0, result.output
    assert "OK:" in result.stdout and "is sound on cpu" in result.stdout


@pytest.mark.parametrize("command", ["verify", "predict", "serve"])
def test_the_compiled_mode_is_an_option_of_every_command_that_loads(command: str) -> None:
    """Compiled mode is on by default where AOTInductor packages ship: a command that loads
    can turn it off (or ask for more), as ``Predictor.load`` can."""
    assert "--compiled [auto|off|shipped|on]" in run(command, "--help").stdout
    result = run(command, "x", "--compiled", "fast")
    assert result.exit_code == 2 and "Invalid value for '--compiled': 'fast'" in result.stderr


@pytest.mark.parametrize(("args", "compiled"), [((), "auto"), (("--compiled", "off"), "off")])
def test_serve_hands_the_compiled_mode_to_every_replica(
        args: tuple[str, ...], compiled: str, cli_artifact: tuple[Path, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    import qkan_pack.serve

    seen = []

    def serve_forever(directory: object, *args: object, replica: object, **kwargs: object) -> None:
        seen.append(replica)

    monkeypatch.setattr(qkan_pack.serve, "serve_forever", serve_forever)
    result = run("serve", str(cli_artifact[0]), "--device", "cpu", *args)
    assert result.exit_code == 0, result.output
    (replica,) = seen
    assert replica.compiled == compiled  # type: ignore[attr-defined]


def test_verify_loads_with_the_compiled_mode_asked(cli_artifact: tuple[Path, str]) -> None:
    path, _ = cli_artifact
    result = run("verify", path, "--compiled", "shipped")
    assert result.exit_code == 0, result.output
    assert "compiled mode: off (compiled='shipped' but precompiled graphs ship for GPU hosts only)" \
        in result.stdout + result.stderr


def test_default_output_is_artifacts_stem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("build", MLP, "--shapes", "1x2")
    assert result.exit_code == 0, result.output
    assert read_artifact(tmp_path / "artifacts" / "qkan_mlp").manifest.model.entry == "build_model"


def test_existing_artifact_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "mlp"
    assert run("build", MLP, "--shapes", "1x2", "-o", out).exit_code == 0
    before = read_artifact(out).digest
    refused = run("build", MLP, "--shapes", "1x2", "-o", out, "--seed", "1")
    assert refused.exit_code == 1
    assert "--force" in one_line_error(refused) and str(out) in refused.stderr
    assert read_artifact(out).digest == before
    forced = run("build", MLP, "--shapes", "1x2", "-o", out, "--seed", "1", "--force")
    assert forced.exit_code == 0, forced.output
    assert read_artifact(out).digest != before


# ---------------------------------------------------------------------------
# Usage errors: exit 2, naming what is wrong
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    (["build", MLP, "--shapes", "1x0"], ["--shapes", "positive"]),
    (["build", MLP, "--shapes", "axb"], ["--shapes", "bad dimension 'a'"]),
    (["build", MLP, "--shapes", "1x2,1x2x3"], ["--shapes", "mix ranks"]),
    (["build", MLP, "--shapes", ""], ["--shapes", "empty"]),
    (["build", MLP], ["give either --shapes"]),
    (["build", MLP, "--shapes", "1x2", "--dtype", "float128"], ["--dtype", "unknown dtype"]),
    (["build", MLP, "--shapes", "1x2", "--config", "novalue"], ["--config", "KEY=VALUE"]),
    (["build", MLP, "--shapes", "1x2", "--config", "a=1", "--config", "a=2"], ["--config", "twice"]),
    (["build", MLP, "--shapes", "1x2", "--capture", "always"], ["--capture", "always"]),
    (["build", MLP, "--shapes", "1x2", "--input-range", "3,1"], ["--input-range", "below"]),
    (["build", MLP, "--shapes", "1x2", "--input-range", "x"], ["--input-range", "LOW,HIGH"]),
    # round 2, finding 8: these exited 1 (a NaN reference, an unexpected RuntimeError)
    (["build", MLP, "--shapes", "1x2", "--input-range", "0,inf"], ["--input-range", "finite"]),
    (["build", MLP, "--shapes", "1x2", "--input-range", "-1e999,0"], ["--input-range", "finite"]),
    (["build", MLP, "--shapes", "1x2", "--dtype", "int64", "--input-range", "0.2,0.8"],
     ["holds no integer for int64"]),
    # round 2, finding 9: a deep --config silently became a string
    (["build", MLP, "--shapes", "1x2", "--config", "width=" + "[" * 70 + "]" * 70],
     ["--config", "deeper than 64"]),
    (["build", MLP, "--shapes", "1x2", "--config", "width=" + "[" * 100_000 + "]" * 100_000],
     ["--config", "invalid JSON"]),
    (["build", MLP, "--shapes", "1x2", "--weights", "/no/such/file.pt"], ["--weights", "does not exist"]),
    (["build", MLP, "--shapes", "1x2", "--seed", "many"], ["--seed"]),
    (["build", MLP, "--shapes", "1x2", "--bogus"], ["No such option", "--bogus"]),
    (["build"], ["Missing argument 'MODEL_PY'"]),
    (["inspect"], ["Missing argument 'DIRECTORY'"]),
    (["verify", "x", "--override", "1=2"], ["--override", "KEY=VALUE"]),
    (["bench-serve", "x", "--kills", "3"], ["--kills goes with --kill-at"]),
    (["frobnicate"], ["No such command 'frobnicate'"]),
])
def test_usage_errors_exit_2(args: list[str], says: list[str]) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    for needle in says:
        assert needle in result.stderr, (needle, result.stderr)


@pytest.mark.parametrize(("args", "says"), [
    (["build", MLP, "--shapes", "1x2", "--pad", "y"],
     "--pad: 'y': write NAME=VALUE with a number or true/false as VALUE (NAME=0)"),
    (["build", MLP, "--shapes", "1x2", "--pad", "x=inf"],  # the example is the input given
     "--pad: 'x=inf': write NAME=VALUE with a number or true/false as VALUE (x=0)"),
    (["build", MLP, "--shapes", "1x2", "--pad", "1y=0"], "--pad: '1y=0': write NAME=VALUE"),
    (["build", MLP, "--shapes", "1x2", "--pad", "x=null"], "--pad: 'x=null': write NAME=VALUE"),
    (["build", MLP, "--shapes", "1x2", "--pad", "x=0", "--pad", " x=1"],
     "--pad: 'x' is given twice"),
    (["build", MLP, "--shapes", "1x2", "--label", "team"], "--label: 'team': write KEY=VALUE"),
    (["build", MLP, "--shapes", "1x2", "--label", " =a"], "--label: ' =a': write KEY=VALUE"),
    (["build", MLP, "--shapes", "1x2", "--label", "a=1", "--label", "a=2"],
     "--label: label 'a' is given twice"),
    (["bench-serve", "x", "--lengths", "8,,128"],
     "--lengths: write LOW,HIGH with 1 <= LOW <= HIGH, e.g. 8,128"),
    (["bench-serve", "x", "--lengths", "0,4"], "--lengths: write LOW,HIGH"),
    (["bench-serve", "x", "--clients", "0,8"], "--clients: write client counts as 1,8,32"),
    (["bench-serve", "x", "--clients", "a"], "--clients: write client counts as 1,8,32"),
    (["bench-serve", "x", "--protocol", " , "], "--protocol: write protocols as json,oip-binary"),
    (["bench-serve", "x", "--split-cpus", "0-3"], "--split-cpus: write the server's CPUs, a colon"),
    (["bench-serve", "x", "--split-cpus", "0-3:a"], "--split-cpus: 'a' is not a CPU number or range"),
    (["bench-serve", "x", "--split-cpus", "3-1:4"], "--split-cpus: '3-1' is not a CPU number"),
    (["bench-serve", "x", "--split-cpus", ":4"], "--split-cpus: write CPUs as 0-7,12"),
    (["predict", "x", "--input", "/no/such.npy"], "--input: /no/such.npy is not a file"),
    (["predict", "x", "--input", "a=/no/such.npy"], "--input: /no/such.npy is not a file"),
])
def test_option_values_the_command_line_reads_itself(args: list[str], says: str) -> None:
    """The command line's own option readers (``--pad``, ``--label``, bench-serve's lists,
    predict's files) refuse what they cannot take as usage errors naming the option."""
    assert one_usage_line(run(*args)).startswith(f"Error: Invalid value for {says}")


@pytest.mark.parametrize("command", ["verify", "bench"])
def test_an_option_error_names_the_option_as_typed(command: str) -> None:
    """A bad ``--override`` was reported as ``--overrides``, an option no command has: the
    usage error names each option by its own (longest) spelling."""
    result = run(command, "x", "--override", "novalue")
    assert result.exit_code == 2, result.output
    assert "Invalid value for --override: " in result.stderr, result.stderr


PLAIN = str(MODELS / "plain_mlp.py")
HOOKED = """\
import torch

def example_input(name, shape, dtype, generator):
    return torch.zeros(shape, dtype=dtype)

def build_model():
    return torch.nn.Linear(2, 2)
"""


def one_usage_line(result: Result) -> str:
    """A usage error: exit 2 and one ``Error:`` line, never "unexpected" or a traceback."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.stderr
    assert "unexpected" not in result.stderr and "Traceback" not in result.output
    return errors[0]


@pytest.mark.parametrize(("args", "says"), [
    (["--shapes", "1x2", "--seed", "100000000000000000000000"],
     ["--seed", "outside 0..9223372036854775807"]),
    (["--shapes", "1x2", "--seed", "-1"], ["--seed", "outside"]),
    (["--shapes", "1x2", "--seed", "1e23"], ["--seed", "not a valid integer"]),
    (["--shapes", "2147483647x2147483647"], ["2147483647x2147483647", "16 EiB", "at most 1 GiB"]),
    (["--shapes", "1x2147483647"], ["1x2147483647 (float32) needs 8 GiB", "at most 1 GiB"]),
])
def test_numbers_torch_cannot_take_are_usage_errors(tmp_path: Path, args: list[str],
                                                    says: list[str]) -> None:
    """Audit (issue 32): ``--seed`` past 2**64 and ``--shapes 2147483647x2147483647`` ended as
    "unexpected ValueError/RuntimeError"; ``--shapes 1x2147483647`` allocated ~8 GiB for 25 s
    before failing. Now refused before any reference input is allocated."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    line = one_usage_line(run("build", PLAIN, *args, "-o", tmp_path / "a"))
    assert all(needle in line for needle in says), line
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 2**20  # < 1 GiB more
    assert not (tmp_path / "a").exists()


def test_input_range_draws_float_references_uniformly(tmp_path: Path) -> None:
    """Audit (issue 32): ``--input-range 0,1`` on a float input was ignored (references
    stayed standard normal) though ``--help`` said uniform."""
    from safetensors.torch import load as load_tensors

    result = run("build", PLAIN, "--shapes", "64x2", "--input-range", "0,1", "-o", tmp_path / "a")
    assert result.exit_code == 0, result.output
    artifact = read_artifact(tmp_path / "a")
    x = load_tensors(bytes(artifact.files[artifact.manifest.shapes[0].reference]))["input.input"]
    assert float(x.min()) >= 0.0 and float(x.max()) < 1.0
    shown = run("inspect", tmp_path / "a")
    assert "in [0, 1) (--input-range)" in shown.output, shown.output
    hooked = tmp_path / "hooked.py"
    hooked.write_text(HOOKED)
    line = one_usage_line(run("build", hooked, "--shapes", "1x2", "--input-range", "0,1",
                              "-o", tmp_path / "b"))
    assert "--input-range has no effect" in line and "example_input()" in line


def test_config_takes_python_false(tmp_path: Path) -> None:
    """Audit (issue 32): ``--config bias=False`` passed the truthy string "False" and built
    a model with biases."""
    model = tmp_path / "biased.py"
    model.write_text("import torch\n\n\ndef build_model(bias=True):\n"
                     "    return torch.nn.Linear(2, 2, bias=bias)\n")
    result = run("build", model, "--shapes", "1x2", "--config", "bias=False", "-o", tmp_path / "a")
    assert result.exit_code == 0, result.output
    assert "(1x2; 4 parameters)" in result.stdout
    assert read_artifact(tmp_path / "a").manifest.model.config == {"bias": False}


# ---------------------------------------------------------------------------
# Failing model files: exit 1, one line naming the file
# ---------------------------------------------------------------------------

FAILING = {
    "import_error": ("import definitely_not_a_module_xyz\n", "definitely_not_a_module_xyz"),
    "syntax_error": ("def build_model(:\n", "syntax error at line 1"),
    "factory_raises": ("def build_model():\n    raise ValueError('bad width 7')\n", "bad width 7"),
    "not_a_module": ("def build_model():\n    return 42\n", "expected a torch.nn.Module"),
    "no_entry": ("import torch\n", "defines no build_model()"),
    "forward_fails": (textwrap.dedent("""
        import torch
        def build_model():
            return torch.nn.Linear(2, 2)
    """), "forward on shape 1x3 failed (build forward)"),
    "nan_output": (textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def forward(self, x):
                return x / 0.0 * 0.0
        def build_model():
            return M()
    """), "NaN/inf"),
}


@pytest.mark.parametrize("case", sorted(FAILING))
def test_failing_model_file_exits_1_with_one_line(tmp_path: Path, case: str) -> None:
    source, says = FAILING[case]
    model = tmp_path / f"{case}.py"
    model.write_text(source)
    shapes = "1x3" if case == "forward_fails" else "1x2"
    result = run("build", model, "--shapes", shapes, "-o", tmp_path / "out")
    assert result.exit_code == 1, result.output
    line = one_line_error(result)
    assert str(model) in line and says in line, line
    assert not (tmp_path / "out").exists()


def test_missing_model_file_and_wrong_suffix(tmp_path: Path) -> None:
    result = run("build", tmp_path / "absent.py", "--shapes", "1x2", "-o", tmp_path / "o")
    assert result.exit_code == 1 and "does not exist" in one_line_error(result)
    (tmp_path / "model.txt").write_text("x")
    result = run("build", tmp_path / "model.txt", "--shapes", "1x2", "-o", tmp_path / "o")
    assert result.exit_code == 1 and "not a .py file" in one_line_error(result)


def test_debug_env_shows_the_exception(tmp_path: Path) -> None:
    model = tmp_path / "broken.py"
    model.write_text(FAILING["factory_raises"][0])
    result = run("build", model, "--shapes", "1x2", "-o", tmp_path / "o",
                 env={"QKAN_PACK_DEBUG": "1"})
    assert result.exit_code == 1
    assert isinstance(result.exception, ModelSourceError)  # re-raised: Python prints the traceback
    assert isinstance(result.exception.__cause__, ValueError)


def test_unexpected_errors_point_at_debug(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import qkan_pack.runtime

    def explode(*args: object, **kwargs: object) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr(qkan_pack.runtime, "read_artifact", explode)
    result = run("inspect", tmp_path)
    assert result.exit_code == 1
    assert "unexpected KeyError" in result.stderr and "QKAN_PACK_DEBUG=1" in result.stderr
    assert "Traceback" not in result.output


def test_verify_and_inspect_failures(tmp_path: Path, cli_artifact: tuple[Path, str]) -> None:
    path, _ = cli_artifact
    result = run("inspect", tmp_path / "nothing")
    assert result.exit_code == 1 and "no artifact" in one_line_error(result)
    wrong = "sha256:" + "0" * 64
    result = run("verify", path, "--expected-digest", wrong)
    assert result.exit_code == 1 and "pinned" in one_line_error(result)
    result = run("verify", path, "--device", "cuda")
    if result.exit_code == 1:  # a CPU-only host
        assert "CUDA is not available" in one_line_error(result)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for file in path.rglob("*"):
        if file.is_file():
            target = damaged / file.relative_to(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(file.read_bytes())
    (damaged / "weights.safetensors").write_bytes(b"\x00" * 16)
    for command in ("verify", "inspect"):
        result = run(command, damaged)
        assert result.exit_code == 1 and "weights.safetensors" in one_line_error(result)


# ---------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_python_m_qkan_pack_builds(tmp_path: Path) -> None:
    out = tmp_path / "mlp"
    env = {**os.environ, "QKAN_PACK_PROGRESS": "0"}
    env.pop("QKAN_PACK_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "qkan_pack", "build", MLP, "--shapes", "1x2",
                           "-o", str(out)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"digest {read_artifact(out).digest}"


CHECK_IMPORTS = textwrap.dedent("""
    import json, sys
    from qkan_pack.cli import main
    codes, heavy = [], {}
    for argv in (["--help"], ["build", "--help"], ["--version"], ["inspect", sys.argv[1]],
                 ["inspect", "--json", sys.argv[1]]):
        try:
            main(argv)
        except SystemExit as exc:
            codes.append(exc.code)
        heavy[argv[0]] = sorted(m for m in ("torch", "qkan", "safetensors", "numpy", "model_signing")
                                if m in sys.modules)
    print(json.dumps({"codes": codes, "heavy": heavy}))
""")


def test_help_and_inspect_do_not_import_torch(cli_artifact: tuple[Path, str]) -> None:
    path, _ = cli_artifact
    proc = subprocess.run([sys.executable, "-c", CHECK_IMPORTS, str(path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # inspect audits safetensors headers with safetensors' own parser: a Rust extension that
    # imports neither torch nor numpy (well under a millisecond)
    assert report == {"codes": [0, 0, 0, 0, 0],
                      "heavy": {"--help": [], "build": [], "--version": [],
                                "inspect": ["safetensors"]}}


# ---------------------------------------------------------------------------
# Terminal injection (round 2, finding 3): untrusted strings are shown, never executed
# ---------------------------------------------------------------------------

FORGE = "\r\x1b[2K\x1b[1A"  # carriage return, erase line, cursor up: rewrite what was shown
HOSTILE = {
    "config": FORGE + "digest     sha256:forged   (integrity verified)",
    "producer": "2.12.0\x1b]0;pwned\x07",  # minor skew: a warning quotes it
    "created": "2026\x1b[2J\x1b[H",
    "output key": "y\x1b[31m\u202e",
    "source": "source/m\x1b[8m.py",
}
CONTROL = ("\x1b", "\r", "\x07", "\u202e")


@pytest.fixture
def hostile_artifact(tmp_path: Path) -> Path:
    """A self-consistent artifact whose manifest strings carry control sequences (editing
    fields that no file digest covers keeps it verifiable; the source is renamed to match)."""
    out = tmp_path / "hostile"
    assert run("build", str(ROOT / "tests" / "models" / "plain_mlp.py"), "--shapes", "1x2",
               "-o", out).exit_code == 0
    raw = json.loads((out / "manifest.json").read_text())
    raw["model"]["config"] = {"note": HOSTILE["config"]}
    raw["producer"]["torch"] = HOSTILE["producer"]
    raw["created"] = HOSTILE["created"]
    raw["shapes"][0]["outputs"] = {"dict": {HOSTILE["output key"]: raw["shapes"][0]["outputs"]}}
    old = raw["model"]["source"]
    (out / old).rename(out / HOSTILE["source"])
    raw["files"][HOSTILE["source"]] = raw["files"].pop(old)
    raw["model"]["source"] = HOSTILE["source"]
    (out / "manifest.json").write_text(json.dumps(raw))
    read_artifact(out)  # still verifies: these fields are not covered by any file digest
    return out


def test_inspect_table_escapes_every_untrusted_string(hostile_artifact: Path) -> None:
    result = run("inspect", hostile_artifact)
    assert result.exit_code == 0, result.output
    for char in CONTROL:
        assert char not in result.stdout, repr(char)
    assert "\\u001b[2K" in result.stdout  # the config, shown as JSON (which escapes)
    assert "\\x07" in result.stdout and "y\\x1b[31m\\u202e" in result.stdout
    assert "source/m\\x1b[8m.py" in result.stdout
    assert result.stdout.count("(integrity verified)") == 2  # the forged one is visible text


def test_inspect_json_stays_exact(hostile_artifact: Path) -> None:
    result = run("inspect", "--json", hostile_artifact)
    assert result.exit_code == 0, result.output
    for char in CONTROL:
        assert char not in result.stdout, repr(char)
    manifest = json.loads(result.stdout)["manifest"]
    assert manifest["model"]["config"]["note"] == HOSTILE["config"]
    assert manifest["producer"]["torch"] == HOSTILE["producer"]
    assert manifest["model"]["source"] == HOSTILE["source"]


def test_error_messages_escape_untrusted_strings(hostile_artifact: Path) -> None:
    (hostile_artifact / "source" / "x\x1b[2J\r.py").write_text("")  # an unlisted file
    result = run("inspect", hostile_artifact)
    assert result.exit_code == 1
    line = one_line_error(result)
    assert "does not list" in line and "x\\x1b[2J .py" in line  # CR: whitespace, one line
    for char in CONTROL:
        assert char not in result.stderr, repr(char)


def test_verify_report_and_warnings_escape_untrusted_strings(hostile_artifact: Path) -> None:
    raw = json.loads((hostile_artifact / "manifest.json").read_text())
    raw["model"]["config"] = {}  # the factory takes no note
    (hostile_artifact / "manifest.json").write_text(json.dumps(raw))
    result = run("verify", hostile_artifact)
    for char in CONTROL:
        assert char not in result.output, repr(char)
    assert "\\x1b]0;pwned\\x07" in result.output  # the producer version, in a warning


def test_named_inputs_from_the_command_line(tmp_path: Path) -> None:
    """--input NAME:SHAPES:DTYPE per input; shapes pair up by position; passed by keyword."""
    out = tmp_path / "multi"
    result = CliRunner().invoke(cli, [
        "build", str(MODELS / "multi_io.py"), "--input", "a:2x3,8x3",
        "--input", "b:2x4,8x4:int64", "-o", str(out)])
    assert result.exit_code == 0, result.output
    manifest = read_artifact(out).manifest
    assert manifest.call == "keyword"
    assert [(d.name, d.dtype) for d in manifest.inputs] == [("a", "float32"), ("b", "int64")]
    assert [dict(e.inputs) for e in manifest.shapes] == [{"a": (2, 3), "b": (2, 4)},
                                                         {"a": (8, 3), "b": (8, 4)}]
    assert (manifest.inputs[1].low, manifest.inputs[1].high) == (0, 8)  # the embedding's rows


@pytest.mark.parametrize(("args", "says"), [
    (["--shapes", "1,2"], "for one shape write '1x2'"),
    ([], "give either --shapes"),
    (["--shapes", "1x2", "--input", "x:1x2"], "give either --shapes"),
    (["--input", "a:2x3,8x3", "--input", "b:2x4"], "same number of shapes"),
    (["--input", "a=2x3"], "NAME:SHAPES"),
    (["--input", "a:2x3:float99"], "unknown dtype"),
])
def test_input_declarations_that_are_usage_errors(args: list[str], says: str,
                                                  tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["build", str(MODELS / "multi_io.py"), *args,
                                      "-o", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert not (tmp_path / "x").exists()


def test_build_prints_a_note_for_an_integer_range_it_could_not_infer(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [
        "build", str(MODELS / "multi_io.py"), "--input", "a:2x3", "--input", "b:2x4:int64",
        "--input-range", "0,8", "-o", str(tmp_path / "ranged")])
    assert result.exit_code == 0 and "note:" not in result.output
    gpt = CliRunner().invoke(cli, [
        "build", str(EXAMPLES / "hqkan_gpt.py"), "--shapes", "1x16", "--dtype", "int64",
        "--config", "block_size=16", "--config", "n_embd=32", "--config", "hidden=16",
        "-o", str(tmp_path / "gpt")])
    assert gpt.exit_code == 0, gpt.output
    assert "note:" not in gpt.output  # example_input() gives valid token ids itself


def test_device_errors_name_the_option_typed(mlp_artifact: Path) -> None:
    """A device this host lacks is an error (exit 1) naming --device, with the fix; text that
    is no device at all is a usage error (exit 2)."""
    missing = run("verify", mlp_artifact, "--device", "cuda")
    assert missing.exit_code == 1
    assert one_line_error(missing) == ("Error: --device cuda: CUDA is not available on this host "
                                       "(no GPU or a CPU-only torch build); use --device cpu")
    for bad in ("tpu", "cuda:x"):
        result = run("verify", mlp_artifact, "--device", bad)
        assert result.exit_code == 2, result.output
        assert "Invalid value for --device" in result.stderr


def test_model_code_failing_at_load_is_a_known_error_naming_the_stage(mlp_artifact: Path) -> None:
    """qkan's flash solver on a CPU: Triton's ImportError comes from model code at load."""
    result = run("verify", mlp_artifact, "--override", 'solver="flash"')
    assert result.exit_code == 1
    line = one_line_error(result)
    assert "unexpected" not in line and "failed (" in line and "Triton" in line, line


def test_serve_options_that_are_not_numbers_or_not_shell_text_are_usage_errors(
        mlp_artifact: Path, tmp_path: Path) -> None:
    """Audit: ``--max-body-mb nan`` and ``inf`` crashed as "unexpected ValueError/OverflowError",
    unbalanced quotes in ``--serve-args`` as "unexpected ValueError", ``--device foo`` only
    once Ray had started replicas that could not load; all exit 2 now, before anything starts.
    A token file's first line is the token (comments may follow)."""
    import socket

    for args in (["serve", str(mlp_artifact), "--max-body-mb", "nan"],
                 ["serve", str(mlp_artifact), "--max-body-mb", "inf"],
                 ["serve", str(mlp_artifact), "--body-timeout-s", "nan"],
                 ["serve", str(mlp_artifact), "--max-batch-wait-ms", "inf"],  # never answered
                 ["serve", str(mlp_artifact), "--max-batch-wait-ms", "1e400"],
                 ["serve", str(mlp_artifact), "--max-batch-wait-ms", "nan"],
                 *(["serve", str(mlp_artifact), option, value]  # a drain or a share never met
                   for option in ("--grace-s", "--gpus-per-replica", "--cpus-per-replica")
                   for value in ("inf", "nan")),
                 ["serve", str(mlp_artifact), "--device", "foo"],  # failed in replicas, 19 s in
                 ["bench-serve", str(mlp_artifact), "--serve-args", "'--replicas"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and "unexpected" not in result.output, (args, result.output)
        if args[-2] in ("--grace-s", "--gpus-per-replica", "--cpus-per-replica"):
            assert f"Invalid value for {args[-2]}: not a finite number" in result.output, \
                result.output
    token = tmp_path / "token"
    token.write_text("abcdefghijklmnopqrstu\n# rotated 2026-12-01\n")
    token.chmod(0o600)  # a token file others may write is refused
    with socket.socket() as taken:  # the start stops at the port check, before Ray
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = CliRunner().invoke(cli, ["serve", str(mlp_artifact), "--auth-token-file",
                                          str(token), "--port", str(taken.getsockname()[1])])
    assert result.exit_code == 1 and "already in use" in result.output, result.output


def test_build_warm_on_a_host_without_a_gpu_names_warm(tmp_path: Path) -> None:
    """Audit: ``build --warm`` on a CPU host said "--device cuda: ...", an option the user never
    typed, and only after building; the message names ``--warm`` (``warm`` itself still says
    ``--device``), and the check comes first: nothing is built, nothing says "compiling"."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only host behaviour")
    result = run("build", MLP, "--shapes", "1x2", "--warm", "-o", tmp_path / "a")
    assert result.exit_code == 1
    assert one_line_error(result).startswith("Error: --warm cuda: qkan-pack warm needs a CUDA GPU")
    assert not (tmp_path / "a").exists()  # checked before the build, not after
    mistyped = run("build", MLP, "--shapes", "1x2", "--warm=cuda:x", "-o", tmp_path / "a")
    assert mistyped.exit_code == 2 and "Invalid value for --warm" in mistyped.stderr
    assert run("build", MLP, "--shapes", "1x2", "-o", tmp_path / "a").exit_code == 0
    warm = run("warm", tmp_path / "a")
    assert warm.exit_code == 1 and one_line_error(warm).startswith("Error: --device cuda:")



# ---------------------------------------------------------------------------
# A new user's first hour: messages that say how to fix it
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "command_usage"), [
    (["build", PLAIN, "--shapes", "1x2", "--pad", "y=0", "-o", "OUT"], "build [OPTIONS] MODEL_PY"),
    (["build", PLAIN, "--shapes", "1x2", "--pad", "y", "-o", "OUT"], "build [OPTIONS] MODEL_PY"),
    (["build", PLAIN, "--shapes", "1x2", "--bogus", "-o", "OUT"], "build [OPTIONS] MODEL_PY"),
    (["verify", "OUT", "--device", "gpu"], "verify [OPTIONS] DIRECTORY"),
])
def test_usage_errors_show_the_commands_own_usage(tmp_path: Path, args: list[str],
                                                  command_usage: str) -> None:
    """A `--pad` usage error in build printed the top-level usage (`qkan-pack [OPTIONS]
    COMMAND`) instead of build's."""
    done = run(*[str(tmp_path / "a") if a == "OUT" else a for a in args])
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("Usage: ") and command_usage in done.stderr.splitlines()[0]
    assert "COMMAND [ARGS]" not in done.stderr and not (tmp_path / "a").exists()


@pytest.mark.parametrize(("args", "exit_code", "error"), [
    (["build", "MISSING", "--shapes", "1x2"], 1,
     {"type": "ModelSourceError", "stage": None}),
    (["build", PLAIN, "--shapes", "1x2", "--pad", "y=0"], 2, {"type": "ShapeSpecError"}),
    (["build", PLAIN, "--shapes", "1x2", "--bogus"], 2, {"type": "NoSuchOption"}),
    (["inspect", "MISSING"], 1, {"type": "ArtifactError", "path": "MISSING"}),
    (["verify", "MISSING", "--device", "gpu"], 2,
     {"type": "DeviceError", "requested": "gpu", "usage": True}),
    (["warm", "MISSING", "--device", "cpu", "--precision", "auto"], 1,
     {"type": "ArtifactError", "path": "MISSING"}),
    (["bench", "MISSING"], 1, {"type": "ArtifactError", "path": "MISSING"}),
])
def test_json_commands_print_one_document_on_failure_too(tmp_path: Path, args: list[str],
                                                         exit_code: int, error: dict) -> None:
    """With --json a failure printed nothing on stdout: a script's json.load raised instead of
    reading the error. The exit status and the stderr line are unchanged; an artifact that
    is not there is named in the error's ``path`` (it was null)."""
    args = [str(tmp_path / "absent") if a == "MISSING" else a for a in args]
    error = {k: str(tmp_path / "absent") if v == "MISSING" else v for k, v in error.items()}
    done = run(*args, "--json")
    assert done.exit_code == exit_code, done.output
    document = json.loads(done.stdout)
    assert document["ok"] is False and set(document) == {"ok", "error"}
    assert document["error"]["message"] and document["error"]["message"] in done.stderr
    assert error.items() <= document["error"].items(), document
    assert run(*args).stdout == ""  # without --json, stdout stays empty


def test_a_json_failure_carries_the_errors_fields(cli_artifact: tuple[Path, str],
                                                 tmp_path: Path) -> None:
    path, digest = cli_artifact
    wrong = "sha256:" + "0" * 64
    done = run("verify", path, "--expected-digest", wrong, "--json")
    assert done.exit_code == 1
    error = json.loads(done.stdout)["error"]
    assert error["type"] == "DigestMismatchError"
    assert error["actual"] == digest and error["expected"] == wrong
    bench_file = run("bench", tmp_path / "absent", "--json", tmp_path / "out.json")
    assert bench_file.exit_code == 1 and bench_file.stdout == ""  # JSON goes to a file there


def test_a_module_beside_the_model_is_named_as_an_include(tmp_path: Path) -> None:
    """A model importing helpers.py beside it failed with "install it: pip install helpers"."""
    import shutil

    shutil.copy(MODELS / "with_include.py", tmp_path / "model.py")
    shutil.copy(MODELS / "tiny_helper.py", tmp_path / "tiny_helper.py")
    done = run("build", tmp_path / "model.py", "--shapes", "1x2", "-o", tmp_path / "a")
    line = one_line_error(done)
    assert f"build with --include {tmp_path / 'tiny_helper.py'}" in line, line
    assert "pip install" not in line
    (tmp_path / "tiny_helper.py").unlink()
    (tmp_path / "tiny_helper").mkdir()  # a package folder is named as such
    shutil.copy(MODELS / "tiny_helper.py", tmp_path / "tiny_helper" / "__init__.py")
    line = one_line_error(run("build", tmp_path / "model.py", "--shapes", "1x2", "-o",
                              tmp_path / "a"))
    assert f"build with --include {tmp_path / 'tiny_helper'}" in line, line
    shutil.rmtree(tmp_path / "tiny_helper")  # nothing beside it: a package to install
    line = one_line_error(run("build", tmp_path / "model.py", "--shapes", "1x2", "-o",
                              tmp_path / "a"))
    assert "install it: pip install tiny_helper" in line and "--include" not in line
    shutil.copy(MODELS / "tiny_helper.py", tmp_path / "tiny_helper.py")
    done = run("build", tmp_path / "model.py", "--shapes", "1x2", "-o", tmp_path / "a",
               "--include", tmp_path / "tiny_helper.py")
    assert done.exit_code == 0, done.output
