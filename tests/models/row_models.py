"""Models whose rows see each other inside a batch (and one whose rows do not): what serve
must never batch requests of different clients into, and the control."""

import torch
from torch import nn
from torch.nn import functional as F

FEATURES = 8


class BalancedMoE(nn.Module):
    """Top-1 mixture of 8 experts with an even router and a per-batch capacity twice the
    fair share: random rows never overflow an expert, but many rows like one client's,
    ahead of it, drop its row."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(FEATURES, 8, bias=False)
        with torch.no_grad():
            q, _ = torch.linalg.qr(torch.randn(FEATURES, FEATURES))
            self.router.weight.copy_(q[:8])
        self.experts = nn.ModuleList(nn.Linear(FEATURES, FEATURES) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # every expert runs on the whole batch (a row's arithmetic never follows its
        # neighbours): only the capacity makes one row's answer depend on the others
        choice = self.router(x).argmax(-1)
        capacity = max(1, int(2.0 * x.shape[0] / len(self.experts)))
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            mine = choice == index
            kept = mine & (torch.cumsum(mine.long(), 0) <= capacity)
            out = torch.where(kept[:, None], expert(x), out)
        return out


class GatheredMoE(BalancedMoE):
    """Top-1 mixture of 8 experts without a capacity, each expert run on the rows routed to
    it (gathered): the answers are the rows' own, but an expert's batch size, and with it
    the rounding of its kernel, follows the neighbours. How much a BLAS kernel's rounding
    moves with the batch size depends on the CPU (on an AVX-512 EPYC, little enough that
    the proof passed), so the kernel's batch-size-dependent rounding is made explicit: its
    outputs pass through a magnitude that grows with the rows it runs on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            rows = (choice == index).nonzero().flatten()
            accumulator = float(2 ** (4 + rows.numel() % 8))
            out[rows] = (expert(x[rows]) + accumulator) - accumulator
        return out


class FlooredScale(nn.Module):
    """Dynamic quantisation whose scale has a floor of 8: the references' values never reach
    it, a client sending 100 moves every row's scale."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().max().clamp(min=8.0) / 127
        return self.linear(torch.round(x / scale) * scale)


class StateAtOneRow(nn.Module):
    """A running maximum in a buffer, updated only by single-row calls."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)
        self.register_buffer("seen", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            self.seen.copy_(torch.maximum(self.seen, x.abs().max()))
            return self.linear(x / self.seen)
        return self.linear(x)


class CalibratedClip(nn.Module):
    """A clip range calibrated on the fly that ignores outliers (values of 6 or more): only
    plausible values move it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)
        self.register_buffer("seen", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top = x.abs().max()
        self.seen.copy_(torch.where(top < 6, torch.maximum(self.seen, top), self.seen))
        return self.linear(x / self.seen)


class DynamicInt8(nn.Module):
    """Dynamic per-tensor int8 quantisation of its input, as dynamic quantisation does: the
    scale is the batch's largest magnitude, so one row's rounding follows the others'."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().max().clamp(min=1e-8) / 127
        quantised = torch.round(x / scale).clamp(-127, 127) * scale
        return self.linear(quantised)


class CapacityMoE(nn.Module):
    """Top-1 mixture of experts with a per-batch capacity (Switch-style): rows routed past an
    expert's capacity are dropped (zeroed), so a row's answer depends on who came before."""

    def __init__(self, experts: int = 4, capacity_factor: float = 1.0) -> None:
        super().__init__()
        self.router = nn.Linear(FEATURES, experts)
        self.experts = nn.ModuleList(nn.Linear(FEATURES, FEATURES) for _ in range(experts))
        self.capacity_factor = capacity_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.router(x).argmax(-1)
        capacity = max(1, int(self.capacity_factor * x.shape[0] / len(self.experts)))
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            rows = (choice == index).nonzero().flatten()[:capacity]
            out[rows] = expert(x[rows])
        return out


class BatchMax(nn.Module):
    """Normalised by the batch's largest value."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x / x.abs().max())


class TrainModeNorm(nn.Module):
    """Batch norm computed from the batch's own statistics (training mode) at inference."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(FEATURES)
        self.linear = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.batch_norm(x, None, None, self.norm.weight, self.norm.bias, training=True)
        return self.linear(normed)


class BatchSoftmax(nn.Module):
    """A softmax across the batch: every row's output is a share of the batch's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x.sum(-1), dim=0)


class LeakyScale(nn.Module):
    """Dynamic quantisation that also reports its scale per row: served in a batch, a row's
    reply carries the batch's largest input value, another client's."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        scale = x.abs().max().clamp(min=1e-8)
        quantised = torch.round(x / scale * 127).clamp(-127, 127) * scale / 127
        return {"y": self.linear(quantised), "scale": scale.expand(x.shape[0]).clone()}


class FixedBatch(nn.Module):
    """Rows independent, but the model reshapes with the batch size it was declared with:
    a batch of one cannot run (the proof's rows-alone trial is skipped, not failed)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            raise RuntimeError("this model needs the declared batch")
        return self.linear(x)


class LongestRowMean(nn.Module):
    """Each row's sum over its real (non-zero) positions divided by the longest real row of
    the batch: padding-proof (all rows cut alike) and row-proof (all rows full) alike pass it,
    yet in a ragged batch a short row's answer follows its longest neighbour."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real = (x.abs().sum(-1) != 0).sum(1)
        return self.head(x.sum(1) / real.max().clamp(min=1))


class ShiftedRows(nn.Module):
    """Row j reads row j - 2 (the batch read as a sequence), and ends with ``squeeze()``: a
    scalar at a batch of one."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 1)
        self.mix = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        previous = torch.zeros_like(x)
        previous[2:] = x[:-2]
        return (self.linear(x) + self.mix(previous)).squeeze()


class OneRowReadsAnother(nn.Module):
    """Row 1 reads row 3; nothing else interacts (a row the alone sample may skip)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if x.shape[0] > 3:
            y = torch.cat([y[:1], y[1:2] + 0.5 * x[3:4, :3], y[2:]])
        return y


class RunningMax(nn.Module):
    """Normalised by the largest magnitude seen so far, kept in a buffer: every answer
    follows every earlier caller's inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)
        self.register_buffer("seen", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.copy_(torch.maximum(self.seen, x.abs().max()))
        return self.linear(x / self.seen)


class ObserverLeftOn(nn.Module):
    """A quantisation-aware model served unconverted: its min/max observer stays on in eval
    mode (torch's default), so each call moves the scale later calls quantise with."""

    def __init__(self) -> None:
        super().__init__()
        from torch.ao.quantization import FakeQuantize, MinMaxObserver

        self.fake_quant = FakeQuantize(observer=MinMaxObserver, quant_min=0, quant_max=255)
        self.linear = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.fake_quant(x))


class PlainAttributeMax(nn.Module):
    """A running maximum kept in a plain attribute (no buffer): only the answers show it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)
        self.seen = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = max(self.seen, float(x.abs().max()))
        return self.linear(x / self.seen)


class SmallColumnSeesTheBatch(nn.Module):
    """A large column beside one 1e7 smaller that reads the batch's mean: compared with a
    few rows' own scale only the small column shows the dependence, and one or two rows
    show no column's scale (the row proof pools the references' channel scales)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        large = 1e5 * self.linear(x)
        small = 1e-2 * (x[:, :1] + x.mean(0, keepdim=True)[:, :1])
        return torch.cat([large, small], 1)


class LengthScaledLeak(nn.Module):
    """Rows of any length: a small column that reads the previous row, beside a column whose
    scale grows with the length squared (1e5 L^2). At 8x4096 the large column is 1e6 times
    its size at 8x8: scaled by the longer shape's channels, the short shape's leak hides."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        small = 0.05 * length * length + x[:, 0] + 0.05 * torch.roll(x[:, 0], 1, 0)
        big = 1e5 * length * length * (1 + 0.001 * x.mean(1))
        return torch.stack([small, big], 1)


class FarThreshold(nn.Module):
    """Rows that interact only when some row holds a value beyond 50: far outside what a
    build draws by default (standard normals, and those sixteen times as large)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return torch.where((x.abs().amax(dim=1) > 50).any(), y + x.abs().amax(), y)


class FixedTable(nn.Module):
    """Logits beside a fixed 8x3 table that merely has as many rows as the 8-row batch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)
        self.prototypes = nn.Parameter(torch.randn(8, 3))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.linear(x), "prototypes": self.prototypes * 1.0}


class ExtraOutputInBatches(nn.Module):
    """One output for a batch of one, two for larger batches."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.linear(x)
        if x.shape[0] == 1:
            return {"logits": y}
        return {"logits": y, "probs": y.softmax(-1)}


class SqueezedHead(nn.Module):
    """A regression head of one output ending in ``.squeeze()``: (B,) at a batch of B, a
    scalar at a batch of one."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).squeeze()


class ChaoticTanh(nn.Module):
    """Row-independent, but numerically chaotic: a deep tanh MLP initialised as PyTorch's
    docs suggest for tanh (``xavier_normal_`` with gain 5/3, zero biases), whose float32
    rounding grows with depth past the row proof's bound (ninth adversarial pass, L1).
    ``narrowed``: the result passes through a float32 tensor made in forward, so its float64
    copy is not float64 throughout and rows alone are compared in float32 only (its noise is
    still measured: everything before that copy ran in float64)."""

    def __init__(self, depth: int = 64, width: int = 256, narrowed: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(FEATURES, width), nn.Tanh()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.Tanh()]
        self.layers = nn.Sequential(*layers, nn.Linear(width, 4))
        for layer in self.layers:
            if isinstance(layer, nn.Linear):
                nn.init.xavier_normal_(layer.weight, gain=nn.init.calculate_gain("tanh"))
                nn.init.zeros_(layer.bias)
        self.narrowed = narrowed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(x)
        if not self.narrowed:
            return y
        out = torch.zeros(y.shape)
        out.copy_(y)
        return out.to(x.dtype)


def build_model(kind: str = "independent") -> nn.Module:
    torch.manual_seed(0)
    if kind == "independent":
        return nn.Sequential(nn.Linear(FEATURES, 16), nn.GELU(), nn.Linear(16, 3))
    if kind == "squeezed":
        return SqueezedHead()
    if kind in ("chaotic", "chaotic_narrowed"):
        return ChaoticTanh(narrowed=kind == "chaotic_narrowed").eval()
    models = {"int8": DynamicInt8, "moe": CapacityMoE, "batch_max": BatchMax,
              "train_norm": TrainModeNorm, "batch_softmax": BatchSoftmax,
              "fixed_batch": FixedBatch, "leaky": LeakyScale, "longest_row": LongestRowMean,
              "shifted": ShiftedRows, "one_reads_another": OneRowReadsAnother,
              "running_max": RunningMax, "observer": ObserverLeftOn,
              "attribute_max": PlainAttributeMax, "fixed_table": FixedTable,
              "extra_output": ExtraOutputInBatches, "balanced_moe": BalancedMoE,
              "gathered_moe": GatheredMoE,
              "floored_scale": FlooredScale, "state_at_one_row": StateAtOneRow,
              "calibrated_clip": CalibratedClip, "small_column": SmallColumnSeesTheBatch,
              "length_leak": LengthScaledLeak, "far_threshold": FarThreshold}
    return models[kind]()
