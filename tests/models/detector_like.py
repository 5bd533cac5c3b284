"""A detector in miniature: candidates scored, those above a threshold kept. With random
weights and a high threshold it detects nothing on random inputs, as torchvision's detectors
do: references that cannot tell one model from another."""

import torch
from torch import nn


class Detector(nn.Module):
    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.score = nn.Linear(4, 1)
        self.box = nn.Linear(4, 4)
        self.threshold = nn.Parameter(torch.tensor(threshold), requires_grad=False)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = self.score(x).squeeze(-1).sigmoid()
        keep = scores > self.threshold
        return {"boxes": self.box(x[keep]), "scores": scores[keep]}


def build_model(threshold: float = 0.5) -> nn.Module:
    torch.manual_seed(0)
    return Detector(threshold)
