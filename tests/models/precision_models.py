"""Models for reduced-precision tests: one whose activations overflow float16 (beyond
65504) while its outputs are moderate, and a small CNN and MLP in float32."""

import torch
from torch import nn


class Overflowing(nn.Module):
    """Hidden activations ``scale`` times a plain layer's, scaled back down: at 1e6 (float16's
    largest value is 65504) float32 and bfloat16 (float32's range) compute it, float16
    overflows to inf; at 1e2 only inputs a thousand times larger than N(0, 1) overflow."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.up = nn.Linear(8, 32)
        self.down = nn.Linear(32, 4)
        with torch.no_grad():
            self.up.weight.mul_(scale)
            self.up.bias.mul_(scale)
            self.down.weight.mul_(1 / scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class SmallColumns(nn.Module):
    """One output column a million times the other four. The small columns pass through an
    offset of 1e3 and back: exact in float32, but bfloat16's spacing at 1e3 is 8, so under
    autocast they come out zero while the large column stays within a rounding unit."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        large = h[:, :1] * 1e6
        small = (h[:, 1:] * 0.1 + 1e3) - 1e3
        return torch.cat([large, small], dim=1).float()


class SmallChannelNCHW(nn.Module):
    """A convolution's two output channels (NCHW: channels on dim 1), one about 1e3 times
    the other: the small one is the large one's bfloat16 rounding away from its exact value
    plus a small signal, so under autocast it is mostly rounding."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        with torch.no_grad():
            self.conv.weight[0] *= 3000.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        with torch.autocast(x.device.type, enabled=False):
            exact = nn.functional.conv2d(x.float(), self.conv.weight[:1].float(),
                                         self.conv.bias[:1].float(), padding=1)
        return torch.cat([y[:, :1].float(), (y[:, :1].float() + y[:, 1:].float()) - exact], 1)


class CancelledColumn(nn.Module):
    """A large column (about 300) and a small one (about 1, some 150x smaller) computed as
    (large + small) - large exactly: in bfloat16 the small one carries the large one's
    rounding, most of its own scale, yet within 1e-2 of the whole output's."""

    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.big.weight.copy_(torch.tensor([[300.0, 0.0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.big(x)[:, 0]
        return torch.stack([h.float(), (h.float() + x[:, 1]) - 300.0 * x[:, 0]], -1)


def build_model(kind: str = "overflow", scale: float = 1e6) -> nn.Module:
    torch.manual_seed(0)
    if kind == "overflow":
        return Overflowing(scale)
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    if kind == "mlp":
        return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                             nn.Linear(64, 8))
    if kind == "small_columns":
        return SmallColumns()
    if kind == "small_channel_nchw":
        return SmallChannelNCHW()
    if kind == "cancelled_column":
        return CancelledColumn()
    raise ValueError(f"unknown kind {kind!r}")
