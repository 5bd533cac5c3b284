"""A plain torch model (no qkan): what the serving-path and packaging tests load."""

import torch


def build_model(width: int = 2, hidden: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(),
                               torch.nn.Linear(hidden, width))
