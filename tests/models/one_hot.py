"""Category ids one-hot encoded, then a linear layer: the ids are no embedding index, so
serve cannot bound them before the replay, and an id past the last category fails the
model. Id 0 is "no category" and counts for nothing, so padding with it is proved harmless
(``build --pad``)."""

import torch
from torch import nn
from torch.nn import functional as F

#: Ids 1..CATEGORIES are categories; 0 is none.
CATEGORIES = 5


class OneHot(nn.Module):
    """``names_ids``: refuse unknown ids with a message that names them, as many models'
    own checks do (else ``F.one_hot``'s "Class values must be smaller than num_classes")."""

    def __init__(self, names_ids: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(CATEGORIES, 3)
        self.names_ids = names_ids

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.names_ids and bool((ids > CATEGORIES).any()):
            raise ValueError(f"unknown category ids {ids[ids > CATEGORIES].tolist()}")
        counts = F.one_hot(ids, CATEGORIES + 1)[..., 1:].sum(1)
        return self.linear(counts.to(self.linear.weight.dtype))


def build_model(names_ids: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return OneHot(names_ids)
