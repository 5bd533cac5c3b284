"""A torch.nn.TransformerEncoder called with a key padding mask, as text models are: in eval
mode torch takes its nested-tensor fast path, which syncs with the host."""

import torch
from torch import nn


class MaskedEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=2, dim_feedforward=64,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(x, src_key_padding_mask=mask == 0)
        return self.head(hidden)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return MaskedEncoder()


def example_input(name: str, shape: tuple[int, ...], dtype: torch.dtype,
                  generator: torch.Generator) -> torch.Tensor:
    """The mask keeps the first three quarters of each row."""
    if name == "mask":
        mask = torch.ones(shape, dtype=dtype)
        mask[:, shape[1] * 3 // 4:] = 0
        return mask
    return torch.randn(shape, dtype=dtype, generator=generator)
