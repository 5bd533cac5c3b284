"""Models for declared padding: some ignore padded positions, some cannot."""

from typing import Any

import torch
from torch import nn


class MeanPool(nn.Module):
    """Token embeddings averaged over every position: padding changes the mean unless the
    mask is used (``masked=True``)."""

    def __init__(self, masked: bool) -> None:
        super().__init__()
        self.masked = masked
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        if self.masked:
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        else:
            pooled = hidden.mean(1)
        return self.head(pooled)


class LargeColumnBeside(nn.Module):
    """A masked mean pool in one output column scaled by 1e9, an unmasked one (padding
    changes it) in the others: relative to the whole output, their change is below 1e-7."""

    def __init__(self) -> None:
        super().__init__()
        self.masked = MeanPool(masked=True)
        self.unmasked = MeanPool(masked=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        large = self.masked(input_ids, attention_mask)[:, :1] * 1e9
        return torch.cat([large, self.unmasked(input_ids, attention_mask)], dim=1)


class GlobalPool(nn.Module):
    """A CNN with a global average pool: padded pixels change every output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


class BatchCentred(nn.Module):
    """Centres each feature over the batch: rows see each other, so padded rows change it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x - x.mean(0, keepdim=True))


class PerToken(nn.Module):
    """Token embeddings where the mask keeps them, one output row per token, laid out as
    ``layout`` says: ``seq_first`` (length, batch, features), ``per_row`` one tensor per
    batch row, ``squeezed`` without the batch dimension when it is one."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        self.layout = layout
        self.embed = nn.Embedding(100, 4)  # ids of tests/serve/test_ragged.py

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1).to(torch.float32)
        if self.layout == "seq_first":
            return hidden.transpose(0, 1).contiguous()
        if self.layout == "per_row":
            return tuple(hidden.unbind(0))
        return hidden.squeeze(0)


def build_model(kind: str = "meanpool") -> nn.Module:
    torch.manual_seed(0)
    if kind in ("meanpool", "masked_meanpool"):
        return MeanPool(masked=kind == "masked_meanpool")
    if kind in ("seq_first", "per_row", "squeezed"):
        return PerToken(kind)
    if kind == "bfloat16_rows":  # (batch, length, 6) in bfloat16, each position alone
        return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 2)).to(torch.bfloat16)
    if kind == "global_pool":
        return GlobalPool()
    if kind == "rows":
        return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 2))
    if kind == "batch_mean":
        return BatchCentred()
    if kind == "large_column":
        return LargeColumnBeside()
    raise ValueError(f"unknown kind {kind!r}")


def example_input(name: str, shape: tuple[int, ...], dtype: torch.dtype,
                  generator: torch.Generator) -> torch.Tensor:
    """Masks of ones (each row ends with a few masked positions); ids and pixels at random."""
    if name == "attention_mask":
        mask = torch.ones(shape, dtype=dtype)
        mask[:, max(1, shape[1] - 2):] = 0
        return mask
    if name == "input_ids":
        return torch.randint(1, 50, shape, generator=generator, dtype=dtype)
    return torch.randn(shape, generator=generator, dtype=dtype)
