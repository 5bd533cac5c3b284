"""A BERT-base-sized encoder (12 layers, hidden 768, 12 heads) from its config, randomly
initialised (no download): the transformer the precision benchmarks measure."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel


def build_model(layers: int = 12) -> torch.nn.Module:
    torch.manual_seed(0)
    return BertModel(BertConfig(num_hidden_layers=layers), add_pooling_layer=False)
