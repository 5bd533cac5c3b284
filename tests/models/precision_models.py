"""Models for reduced-precision tests: one whose activations overflow float16 (beyond
65504) while its outputs are moderate, a small CNN and MLP in float32, a small residual
network (batch-norm statistics and affine weights set as training would leave them, its
feature map among the outputs on request) for channels-last graphs, and a CNN whose
forward cannot run channels-last (``view`` on a convolution's output)."""

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


class _Block(nn.Module):
    """A residual block: two 3x3 convolutions with batch norm, a 1x1 projection where the
    shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


class TinyResNet(nn.Module):
    """resnet50's structure in miniature: a stem, residual blocks (one strided), a global
    pool and a linear head; with ``features``, ``{"logits", "features"}`` (the last block's
    4-D map) instead of the logits alone."""

    def __init__(self, features: bool = False) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.blocks = nn.Sequential(_Block(16, 16, 1), _Block(16, 32, 2))
        self.head = nn.Linear(32, 10)
        self.features = features
        with torch.no_grad():  # as training leaves them: not the identity a fresh BN is
            for module in self.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.running_mean.uniform_(-0.2, 0.2)
                    module.running_var.uniform_(0.5, 2.0)
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        feature_map = self.blocks(self.stem(x))
        logits = self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(feature_map, 1), 1))
        return {"logits": logits, "features": feature_map} if self.features else logits


class LengthScaledCancel(nn.Module):
    """Rows of any length: a small column computed as the difference of two large matmul
    outputs (bfloat16 cancels it) beside one growing with the length squared (1e5 L^2)."""

    def __init__(self) -> None:
        super().__init__()
        self.h = nn.Linear(1, 2, bias=False)
        with torch.no_grad():
            self.h.weight[0, 0], self.h.weight[1, 0] = 1000.0, 1010.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        h = self.h(x[:, :1]).float()
        small = (h[:, 1] - h[:, 0]) + 0.05 * length * length
        big = 1e5 * length * length * (1 + 0.001 * x.mean(1))
        return torch.stack([small, big], 1)


class LogFeatures(nn.Module):
    """Takes the log of its inputs: random normal draws make NaN; real data is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.log(x))


class ViewAfterConv(nn.Module):
    """A convolution's output flattened with ``view``: fine on a contiguous tensor, an error
    on a channels-last one (its channels are no longer the outermost of C, H, W)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        return self.head(y.view(y.shape[0], -1))


class NoFloat16Kernel(nn.Module):
    """A layer whose next op has no float16 kernel on the build host (as complex ``exp`` in
    ComplexHalf has none on a CPU): under float16 autocast the forward raises."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.dtype == torch.float16:
            raise NotImplementedError('"exp_vml_cpu" not implemented for \'ComplexHalf\'')
        return y.float()


def build_model(kind: str = "overflow", scale: float = 1e6) -> nn.Module:
    torch.manual_seed(0)
    if kind == "no_float16_kernel":
        return NoFloat16Kernel()
    if kind in ("resnet", "resnet_features"):
        return TinyResNet(features=kind == "resnet_features")
    if kind == "view_after_conv":
        return ViewAfterConv()
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
    if kind == "length_cancel":
        return LengthScaledCancel()
    if kind == "log_features":
        return LogFeatures()
    raise ValueError(f"unknown kind {kind!r}")
