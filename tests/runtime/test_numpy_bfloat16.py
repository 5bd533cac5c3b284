"""A model with a bfloat16 output called with numpy inputs: numpy has no bfloat16, so that
output comes back as a host tensor (the others as numpy), where the call used to fail."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from qkan_pack import Predictor, build

SOURCE = '''import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        y = self.lin(x)
        return y.to(torch.bfloat16), y


def build_model():
    torch.manual_seed(0)
    return M()
'''


def test_numpy_inputs_give_a_bfloat16_output_as_a_tensor(tmp_path: Path) -> None:
    source = tmp_path / "bf16_out.py"
    source.write_text(SOURCE)
    path = build(source, "1x2", output=tmp_path / "a", progress=False).path
    x = np.random.default_rng(0).random((1, 2), dtype=np.float32)
    with Predictor.load(path, "cpu", progress=False) as predictor:
        half, full = predictor(x)
        assert isinstance(full, np.ndarray) and full.dtype == np.float32
        assert isinstance(half, torch.Tensor) and half.dtype == torch.bfloat16
        assert half.device.type == "cpu"
        torch.testing.assert_close(half, torch.from_numpy(full).to(torch.bfloat16))
