"""What a capture failure names: the op a CUDA graph cannot hold and the model line that
issued it (found by an eager rerun under a dispatch mode; testable on the CPU)."""

from __future__ import annotations

import torch

from qkan_pack.runtime import explain_capture_failure

CPU = torch.device("cpu")


class ItemModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().max().item()  # the line the message must name
        return x / scale


class MaskModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].sum().reshape(1)


class HostTensorModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(x.shape[-1]).to(x.device)


class CleanModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2


def test_item_is_named_with_its_line() -> None:
    found = explain_capture_failure(ItemModel(), [torch.randn(4)], CPU)
    assert found is not None and "aten::_local_scalar_dense" in found and ".item()" in found
    assert "test_diagnose.py:15" in found


def test_boolean_mask_is_named() -> None:
    found = explain_capture_failure(MaskModel(), [torch.randn(4)], CPU)
    assert found is not None and "boolean mask" in found and "test_diagnose.py" in found


def test_host_to_device_copy_is_named() -> None:
    """On the CPU the 'device' is the meta device: any copy between it and the host counts."""
    found = explain_capture_failure(HostTensorModel(), [torch.randn(4, device="meta")],
                                    torch.device("meta"))
    assert found is not None and "copy between the host and meta" in found


def test_a_clean_model_names_nothing() -> None:
    assert explain_capture_failure(CleanModel(), [torch.randn(4)], CPU) is None


def test_a_failing_forward_does_not_hide_the_original_error() -> None:
    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    assert explain_capture_failure(Broken(), [torch.randn(2)], CPU) is None
