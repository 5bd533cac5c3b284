"""Builds normally; its factory raises where QKAN_PACK_TEST_FAIL_LOAD is set (a serve replica
whose load fails must never serve)."""

import os

import torch


def build_model(width: int = 2) -> torch.nn.Module:
    if os.environ.get("QKAN_PACK_TEST_FAIL_LOAD"):
        raise RuntimeError("this replica was told to fail its load")
    torch.manual_seed(0)
    return torch.nn.Linear(width, width)
