"""Models users already converted: TorchScript modules pack and load; quantized modules are
refused at build with the entry named, leaving nothing on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qkan_pack import ModelSourceError, Predictor, build

MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.inner(x)))


def build_model(kind="script"):
    net = Net().eval()
    if kind == "script":
        return torch.jit.script(net)
    if kind == "trace":
        return torch.jit.trace(net, torch.randn(2, 16))
    return torch.ao.quantization.quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8)
'''


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_modules_load_and_equal_eager(kind: str, tmp_path: Path) -> None:
    """A scripted module failed at load: TorchScript reads its source through inspect, and
    the verified source was no file on disk ("source code not available"); then
    Module.requires_grad_ refused ScriptModules."""
    source = tmp_path / "scripted.py"
    source.write_text(MODEL)
    path = build(source, "2x16,4x16", output=tmp_path / "a", config={"kind": kind},
                 progress=False).path
    namespace: dict = {}
    exec(compile(MODEL, "eager", "exec"), namespace)
    eager = namespace["Net"]().eval()  # seeded in __init__: the factory's weights
    with Predictor.load(path, progress=False) as predictor:
        for rows in (2, 4):
            x = torch.randn(rows, 16)
            with torch.no_grad():
                torch.testing.assert_close(predictor(x), eager(x), rtol=1e-5, atol=1e-6)


def test_a_quantized_module_is_refused_at_build_naming_the_entry(tmp_path: Path) -> None:
    source = tmp_path / "quantized.py"
    source.write_text(MODEL)
    with pytest.raises(ModelSourceError, match=r"'inner\._packed_params\.dtype' is a dtype.*"
                                               r"build the float model"):
        build(source, "2x16", output=tmp_path / "q", config={"kind": "quant"}, progress=False)
    assert not (tmp_path / "q").exists()


def test_two_artifacts_sharing_a_source_name_never_read_each_others_lines() -> None:
    """Both artifacts' files are ``source/model.py``: each is compiled and given to
    linecache under its own content-addressed name, so TorchScript or a traceback reads
    each one's own lines (the shared name used to be dropped, and then read from disk)."""
    import inspect
    import linecache

    from qkan_pack.runtime import import_model_source

    first = b"def f():\n    return 1\n"
    second = b"\n\ndef f():\n    return 2\n"
    name = "source/shared_name_test.py"
    one = import_model_source(name, {name: first})
    two = import_model_source(name, {name: second})
    assert (one.f(), two.f()) == (1, 2) and name not in linecache.cache
    assert inspect.getsource(one.f) == "def f():\n    return 1\n"
    assert inspect.getsource(two.f) == "def f():\n    return 2\n"
    assert one.f.__code__.co_filename != two.f.__code__.co_filename
