"""Models whose outputs hold a small channel beside one far larger, each built so that only
measuring the small channel on its own scale (over the right rows) sees what is wrong:
a padded length that leaks into it, a row that reads its neighbour, bfloat16 cancelling
it, or outputs in the tens of thousands that a reduced precision keeps."""

import torch
import torch.nn.functional as F
from torch import nn


class PaddedLengthLeak(nn.Module):
    """x: (B, L) with 0 as padding; n is a row's unpadded length. Column 0 is 0.05 n^2 plus
    5e-5 L (the padded length leaks in), column 1 1e3 n^2: at the full length the large
    column is 1e6 times its size at a cut one, so the full length's scale hides the leak."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = (x != 0).sum(1).to(x.dtype)
        small = 0.05 * n * n + 5e-5 * x.shape[1]
        big = 1e3 * n * n * (1 + 0.001 * x.sum(1) / n.clamp(min=1))
        return torch.stack([small, big], 1)


class NeighbourReader(nn.Module):
    """Column 0 reads the previous row's second feature; column 1 is 1e8. One reference row
    a million times larger than the rest would set column 0's scale for every compared row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        previous = torch.cat([torch.zeros_like(x[:1, 1]), x[:-1, 1]])
        small = x[:, 0] + 0.05 * previous
        big = 1e8 * (1 + 0.001 * x[:, 2:].mean(1))
        return torch.stack([small, big], 1)


class SmallFeature(nn.Module):
    """Column 0 is 100 x0 computed as (100 + 100 x0) - 100, which bfloat16 rounds to 0 for
    the small x0 of real data; column 1 is 1e5. Random draws of larger x0 show column 0 at
    a scale the real data never reach."""

    def __init__(self) -> None:
        super().__init__()
        self.h = nn.Linear(1, 2)
        with torch.no_grad():
            self.h.weight[:] = torch.tensor([[0.0], [100.0]])
            self.h.bias[:] = 100.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.h(x[:, :1]).float()
        return torch.stack([h[:, 1] - h[:, 0], 1e5 * (1 + 0.001 * x[:, 1])], 1)


class Price(nn.Module):
    """Outputs in the tens of thousands for features in [0, 1] (float16 keeps them); random
    normal features take them past float16's 65504."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 2)
        with torch.no_grad():
            self.linear.weight.uniform_(0, 1)
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * 5e4


class ZeroColumn(nn.Module):
    """An ordinary MLP regressor with a ninth output column that is always 0 (a reserved
    target, a ReLU unit dead on these inputs): the zero channel is far below the others,
    which must not put the others, 4-15x below the largest, on their own scales."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)
        return torch.cat([y, torch.zeros_like(y[:, :1])], 1)


class GatedNeighbour(nn.Module):
    """Column 0 is 1e6 x0 where x2 > 0, else x0, plus 0.05 times the previous row's x1;
    column 1 is x3. Drawn rows of both kinds put column 0's scale at 1e6 in every compared
    set, where a leak into the small rows is below any bound relative to the channel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        previous = torch.cat([torch.zeros_like(x[:1, 1]), x[:-1, 1]])
        return torch.stack([_gated(x) + 0.05 * previous, x[:, 3]], 1)


def _gated(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x[:, 2] > 0, 1e6 * x[:, 0], x[:, 0])


class GatedOtherRows(nn.Module):
    """Column 0 is the gated head plus ``term`` where some other row of the batch has
    |x1| > 0.3; column 1 is x3. In a batch of N(0, 1) rows replacing neighbours by other
    draws almost never switches the term off: only a row alone does, through other kernels."""

    def __init__(self, term: float = 0.1) -> None:
        super().__init__()
        self.term = term

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = (x[:, 1].abs() > 0.3).float()
        others = wide.sum() - wide
        return torch.stack([_gated(x) + self.term * (others > 0).float(), x[:, 3]], 1)


class GatedBatchSize(GatedOtherRows):
    """Column 0 is the gated head plus ``term`` whenever the batch has more than one row;
    column 1 is x3: a row's answer depends on whether serve batched it, and only a row alone
    shows it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([_gated(x) + self.term * float(x.shape[0] > 1), x[:, 3]], 1)


class PlainProjection(nn.Module):
    """A fixed projection kept as a plain float32 attribute (no parameter or buffer: the
    float64 copy cannot run); column 0 is 1e5 times one head, column 1 another head plus
    0.1 when the batch has other rows (a term only a row alone switches off)."""

    def __init__(self) -> None:
        super().__init__()
        self.projection = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.projection)
        return torch.stack([1e5 * h[:, 0], h[:, 1] + 0.1 * float(x.shape[0] > 1)], 1)


def relu_features(width: int = 512) -> nn.Module:
    """A feature extractor returning post-ReLU features: a channel active in few rows is
    small where it is active, though its terms are of the whole output's size."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 1024), nn.GELU(), nn.Linear(1024, width), nn.ReLU())


class Cast(nn.Module):
    """``model`` with its input taken as float32 whatever it is (``x.float()``, to accept any
    dtype), or its output returned in bfloat16 (half the bytes on the wire)."""

    def __init__(self, model: nn.Module, where: str) -> None:
        super().__init__()
        self.model, self.where = model, where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.where == "input":
            return self.model(x.float())
        return self.model(x).to(torch.bfloat16)


def build_model(kind: str, cast: str = "", term: float = 0.1) -> nn.Module:
    if cast:
        return Cast(build_model(kind, term=term), cast)
    if kind in ("gated_other_rows", "gated_batch_size"):
        return GatedOtherRows(term) if kind == "gated_other_rows" else GatedBatchSize(term)
    models = {"padded_length_leak": PaddedLengthLeak, "neighbour_reader": NeighbourReader,
              "small_feature": SmallFeature, "price": Price, "zero_column": ZeroColumn,
              "gated_neighbour": GatedNeighbour, "plain_projection": PlainProjection}
    return relu_features() if kind == "relu_features" else models[kind]()

