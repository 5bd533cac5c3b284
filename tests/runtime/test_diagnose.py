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


def test_graphs_of_a_discarded_submodule_are_not_counted() -> None:
    """Audit: a submodule that captured at one shape and failed at another was discarded, but
    its graphs stayed counted in the shape records (``report.shapes[i].graphs``). A pool that
    captures eagerly on the CPU and refuses every call with 4 rows stands in for CUDA."""
    from qkan_pack.errors import CaptureError
    from qkan_pack.runtime._report import ShapeRecord
    from qkan_pack.runtime._submodules import capture_submodules

    class Graph:
        def __init__(self, fn) -> None:
            self.fn = fn

        def replay_copy(self, tensors):
            return self.fn(*tensors)

    class RefusesFourRows:
        device = torch.device("cpu")

        def capture(self, fn, sample):
            if tuple(sample[0].shape) == (4, 2):
                raise CaptureError("aten::nonzero (its output size depends on the data)")
            return Graph(fn), 1000

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(2, 3), torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    model = torch.nn.Sequential(Block(), torch.nn.Linear(3, 3))
    samples = [("1x2", [torch.zeros(1, 2)]), ("4x2", [torch.zeros(4, 2)])]
    records = [ShapeRecord(label=label) for label, _ in samples]
    chosen = capture_submodules(model, model, RefusesFourRows(), samples, [0, 1], (), records,
                                progress=False)
    assert sum(r.graphs for r in records) == sum(len(c.graphs) for c in chosen) > 0
