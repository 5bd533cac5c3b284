"""A small GPT whose MLP is Linear -> QKAN -> Linear (HQKAN), token ids in, logits out.

    qkan-pack build examples/hqkan_gpt.py --shapes 1x128,8x128 --dtype int64

The LM head is tied to the token embedding (stored once in the artifact, re-tied at
load). ``example_input`` gives the packager valid token ids for the reference inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from qkan import QKAN
from torch import nn


class HQKANMLP(nn.Module):
    """Linear -> QKAN -> Linear: the launch-bound block (many tiny kernels)."""

    def __init__(self, n_embd: int, hidden: int, reps: int, solver: str, device: str) -> None:
        super().__init__()
        self.up = nn.Linear(n_embd, hidden, device=device)
        self.qkan = QKAN([hidden, hidden], reps=reps, solver=solver, device=device, seed=0)
        self.down = nn.Linear(hidden, n_embd, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.qkan(self.up(x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, device: str) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, device=device)
        self.proj = nn.Linear(n_embd, n_embd, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        shape = (batch, length, self.n_head, channels // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, length, channels))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, hidden: int, reps: int, solver: str,
                 device: str) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, device=device)
        self.attn = CausalSelfAttention(n_embd, n_head, device)
        self.ln2 = nn.LayerNorm(n_embd, device=device)
        self.mlp = HQKANMLP(n_embd, hidden, reps, solver, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class HQKANGPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 hidden: int, reps: int, solver: str, device: str) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd, device=device)
        self.pos_emb = nn.Embedding(block_size, n_embd, device=device)
        self.blocks = nn.ModuleList(
            Block(n_embd, n_head, hidden, reps, solver, device) for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(n_embd, device=device)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False, device=device)
        self.lm_head.weight = self.tok_emb.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model(vocab_size: int = 256, block_size: int = 128, n_layer: int = 2, n_head: int = 4,
                n_embd: int = 64, hidden: int = 32, reps: int = 2, solver: str | None = None,
                seed: int = 0, device: str = "cpu") -> nn.Module:
    torch.manual_seed(seed)
    on_gpu = torch.device(device).type == "cuda"
    return HQKANGPT(vocab_size, block_size, n_layer, n_head, n_embd, hidden, reps,
                    solver or ("flash" if on_gpu else "exact"), device)


def example_input(name: str, shape: tuple[int, ...], dtype: torch.dtype,
                  generator: torch.Generator) -> torch.Tensor:
    """Reference token ids: valid for the default vocabulary of 256."""
    return torch.randint(0, 256, shape, generator=generator, dtype=dtype)
