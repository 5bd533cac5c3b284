"""The CLI as tools use it: one JSON document on stdout with --json (messages on stderr),
`predict` on input files, and the shared device default."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from qkan_pack import Predictor, build
from qkan_pack.cli import cli

from .conftest import MODELS


def run(*args: object) -> Result:
    """The CLI in process; ``stdout`` and ``stderr`` apart (``output`` has both)."""
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(MODELS / "plain_mlp.py", "2x2,8x2", output=tmp_path_factory.mktemp("a") / "mlp",
                 progress=False).path


def test_build_and_verify_json_are_one_document_on_stdout(tmp_path: Path) -> None:
    built = run("build", MODELS / "plain_mlp.py", "--shapes", "2x2", "-o", tmp_path / "a",
                "--json")
    assert built.exit_code == 0, built.output
    document = json.loads(built.stdout)
    assert document["digest"].startswith("sha256:") and document["path"] == str(tmp_path / "a")
    assert document["manifest"]["metadata"]["name"] == "plain_mlp"
    assert "built " in built.stderr
    verified = run("verify", tmp_path / "a", "--json")
    assert verified.exit_code == 0
    report = json.loads(verified.stdout)
    assert report["ok"] is True and report["device"] == "cpu"
    assert report["digest"] == document["digest"] and report["report"]["shapes"]
    assert "OK:" in verified.stderr


def test_bench_json_without_a_file_prints_the_results(artifact: Path) -> None:
    done = run("bench", artifact, "--iters", "3", "--repeats", "1", "--warmup", "1", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["device"] == "cpu"


def test_predict_summarises_or_writes_outputs_like_the_python_api(artifact: Path,
                                                                   tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    with Predictor.load(artifact) as predictor:
        want = predictor(x)
    shown = run("predict", artifact, "--input", tmp_path / "x.npy")
    assert shown.exit_code == 0 and "8x2" in shown.stdout and "float32" in shown.stdout
    for suffix in (".npy", ".npz", ".json", ".safetensors"):
        out = tmp_path / f"out{suffix}"
        done = run("predict", artifact, "--input", f"x={tmp_path / 'x.npy'}", "-o", out)
        assert done.exit_code == 0, done.output
        if suffix == ".npy":
            got = np.load(out)
        elif suffix == ".npz":
            got = np.load(out)["output"]
        elif suffix == ".json":
            got = np.asarray(json.loads(out.read_text())["output"], dtype=np.float32)
        else:
            from safetensors.numpy import load_file
            got = load_file(str(out))["output"]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    (tmp_path / "in.json").write_text(json.dumps(x.tolist()))
    assert run("predict", artifact, "--input", tmp_path / "in.json").exit_code == 0


def test_predict_refuses_as_the_api_does_with_numpy_advice(artifact: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "wide.npy", np.ones((8, 2)))  # float64
    done = run("predict", artifact, "--input", tmp_path / "wide.npy")
    assert done.exit_code == 1
    assert "array.astype(numpy.float32)" in done.output and ".to(torch" not in done.output
    np.save(tmp_path / "odd.npy", np.ones((3, 2), np.float32))
    done = run("predict", artifact, "--input", tmp_path / "odd.npy")
    assert done.exit_code == 1 and "accepted: 2x2 float32 | 8x2 float32" in done.output
    (tmp_path / "in.txt").write_text("1 2")
    done = run("predict", artifact, "--input", tmp_path / "in.txt")
    assert done.exit_code == 1 and "unknown file type .txt" in done.output


def test_predictor_load_defaults_to_auto(artifact: Path) -> None:
    import inspect

    assert inspect.signature(Predictor.load).parameters["device"].default == "auto"
    with Predictor.load(artifact) as predictor:
        assert predictor.report.device == "cpu"  # no GPU here: auto is the CPU, and says so


def test_messages_say_what_is_there_and_advise_only_what_helps(tmp_path: Path) -> None:
    """A stray file in -o DIR read 'an artifact already exists… pass --force (force=True)', and
    --force then refused; a path under /proc advised 'free space'; a CPU-only report printed
    'solvers -; factory device None'."""
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "notes.txt").write_text("mine")
    for extra in ((), ("--force",)):
        done = run("build", MODELS / "plain_mlp.py", "--shapes", "2x2", "-o",
                   tmp_path / "stray", *extra)
        assert done.exit_code == 1 and "is not an artifact but holds notes.txt" in done.output
    assert (tmp_path / "stray" / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert run("build", MODELS / "plain_mlp.py", "--shapes", "2x2", "-o",
               tmp_path / "empty").exit_code == 0  # an empty folder is no artifact to replace
    again = run("build", MODELS / "plain_mlp.py", "--shapes", "2x2", "-o", tmp_path / "empty")
    assert again.exit_code == 1 and "build with --force to replace it" in again.output
    assert "force=True" not in again.output
    verified = run("verify", tmp_path / "empty")
    assert "solvers" not in verified.output and "factory device" not in verified.output


def test_a_comma_only_shape_list_is_called_ambiguous_even_when_dims_repeat() -> None:
    done = run("build", MODELS / "plain_mlp.py", "--shapes", "1,3,32,32")
    assert done.exit_code == 2 and "is ambiguous" in done.output and "'1x3x32x32'" in done.output


def test_python_api_type_errors_name_the_parameter(tmp_path: Path) -> None:
    import torch

    from qkan_pack import OptionError

    with pytest.raises(OptionError, match=r"model_path=.*an nn\.Module"):
        build(torch.nn.Linear(2, 2), "2x2")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="option dtype=3"):
        build(MODELS / "plain_mlp.py", "2x2", dtype=3)  # type: ignore[arg-type]
    result = build(MODELS / "plain_mlp.py", "2x2", dtype=torch.float32, output=tmp_path / "a",
                   progress=False)  # a torch.dtype is as good as its name
    assert result.manifest.inputs[0].dtype == "float32"


def test_a_pickled_model_as_weights_says_so_without_escape_codes(tmp_path: Path) -> None:
    import torch

    torch.save(torch.nn.Linear(2, 2), tmp_path / "model.pt")
    done = run("build", MODELS / "plain_mlp.py", "--shapes", "2x2", "--weights",
               tmp_path / "model.pt", "-o", tmp_path / "a")
    assert done.exit_code == 1 and "pickled Python objects" in done.output
    assert "\\x1b" not in done.output and "\x1b" not in done.output


def test_newcomer_mistakes_get_a_one_line_fix(tmp_path: Path) -> None:
    """From a newcomer audit: each message says what was wrong and how to fix it."""
    from .conftest import EXAMPLES

    mlp = EXAMPLES / "plain_mlp.py"
    spaced = run("build", mlp, "--shapes", "1x4", "32x4", "-o", tmp_path / "a")
    assert spaced.exit_code == 2 and "joined by commas" in spaced.output
    typo = run("build", mlp, "--shapes", "1x4", "--config", "hiden=64", "-o", tmp_path / "b")
    assert typo.exit_code == 1 and "did you mean hidden?" in typo.output
    assert "It takes: features, hidden, classes" in typo.output
    entry = run("build", mlp, "--shapes", "1x4", "--entry", "buildmodel", "-o", tmp_path / "c")
    assert entry.exit_code == 1 and "did you mean build_model()?" in entry.output


def test_predict_names_the_input_and_the_file(artifact: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 2), np.float32))
    wrong = run("predict", artifact, "--input", f"y={tmp_path / 'x.npy'}")
    assert wrong.exit_code == 1 and "no input is named 'y'; inputs are input (or x)" in wrong.output
    csv = run("predict", artifact, "--input", tmp_path / "x.npy", "-o", tmp_path / "out.csv")
    assert csv.exit_code == 2 and "out.csv" in csv.output  # refused before the load
    np.save(tmp_path / "wide.npy", np.ones((2, 2)))
    wide = run("predict", artifact, "--input", tmp_path / "wide.npy")
    assert wide.exit_code == 1 and (f"--input {tmp_path / 'wide.npy'}: input 'input' is float64 "
                                    "in the file, and the model takes float32") in wide.output
    np.save(tmp_path / "long.npy", np.ones((2, 3), np.float32))
    long = run("predict", artifact, "--input", tmp_path / "long.npy")
    assert long.exit_code == 1 and f"inputs from {tmp_path / 'long.npy'}" in long.output


def test_an_unnamed_array_for_a_model_of_several_inputs_says_to_name_it(tmp_path: Path) -> None:
    path = build(MODELS / "multi_io.py", [{"a": (1, 3), "b": (1, 2)}],
                 dtype={"a": "float32", "b": "int64"}, output=tmp_path / "m", progress=False).path
    np.save(tmp_path / "a.npy", np.ones((1, 3), np.float32))
    done = run("predict", path, "--input", tmp_path / "a.npy")
    assert done.exit_code == 1 and "name its input, --input a=" in done.output


def test_predict_shape_refusals_end_with_the_fix(artifact: Path, tmp_path: Path) -> None:
    """Shape errors listed what is accepted but never how to fix it."""
    np.save(tmp_path / "big.npy", np.ones((64, 2), np.float32))
    done = run("predict", artifact, "--input", tmp_path / "big.npy")
    assert done.exit_code == 1
    assert (f"inputs from {tmp_path / 'big.npy'}: input shape 64x2 is not in the manifest; "
            "accepted: 2x2 float32 | 8x2 float32; to run it, split the batch: the largest "
            "declared is 8") in done.stderr
    np.save(tmp_path / "odd.npy", np.ones((3, 2), np.float32))
    done = run("predict", artifact, "--input", tmp_path / "odd.npy")
    assert "declare its shape at build: --shapes 2x2,8x2,3x2; or let smaller calls be padded: " \
           "build with --pad x=0" in done.stderr
