"""Tiny transformers models built from configs (no downloads): what a user of the
transformers library brings, unchanged."""

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    T5Config,
    T5ForConditionalGeneration,
)

VOCAB = 100


def build_model(arch: str = "bert", use_cache: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "bert":
        return BertForSequenceClassification(BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=37, max_position_embeddings=64, num_labels=3))
    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
            bos_token_id=0, eos_token_id=0, use_cache=use_cache))
    if arch == "t5":
        return T5ForConditionalGeneration(T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=2,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, use_cache=use_cache))
    raise ValueError(f"unknown arch {arch!r}")
