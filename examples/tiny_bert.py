"""A transformers model packed unchanged: BERT from a small config (no download).

    qkan-pack build examples/tiny_bert.py --input input_ids:1x32,8x32:int64 \
        --input attention_mask:1x32,8x32:int64

Named inputs reach ``forward`` by keyword; ``input_ids`` draw from the rows of the
embedding they index. A pretrained model is the same factory returning
``BertForSequenceClassification.from_pretrained(...)``, or this one with ``--weights``.
"""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForSequenceClassification


def build_model(layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=128, num_labels=3))
