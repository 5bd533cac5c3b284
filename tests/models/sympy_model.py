"""A model whose source uses sympy at import time and in forward (deferred-import tests).

``SCALE`` is d/dx x**3 at x = 2 (= 12), computed by sympy when the source is imported;
forward adds sympy's Rational(1, 3) as a float on every call.
"""

import sympy
import torch

_X = sympy.Symbol("x")
SCALE = float(sympy.diff(_X**3, _X).subs(_X, 2))


class SympyScaled(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * SCALE + float(sympy.Rational(1, 3))


def build_model(width: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return SympyScaled(width)
