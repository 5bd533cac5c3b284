"""What a capture failure names: the op a CUDA graph cannot hold and the model line that
issued it (found by an eager rerun under a dispatch mode; testable on the CPU)."""

from __future__ import annotations

import torch

from qkan_pack.runtime._diagnose import explain_capture_failure

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


def test_the_nested_tensor_fast_path_is_named() -> None:
    """nn.TransformerEncoder with a key padding mask (eval) builds nested tensors: the capture
    failure read 'operation failed due to a previous error during capture', naming nothing."""
    import sys

    from ..conftest import MODELS

    sys.path.insert(0, str(MODELS))
    try:
        import masked_encoder
    finally:
        sys.path.remove(str(MODELS))
    model = masked_encoder.build_model().eval()
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[:, 12:] = 0
    found = explain_capture_failure(model, [torch.randn(2, 16, 32), mask], torch.device("cuda"))
    assert found is not None and "nested tensors" in found and "enable_nested_tensor=False" in found
    assert "masked_encoder.py:" in found


def test_ops_torch_tags_as_data_dependent_are_named() -> None:
    found = explain_capture_failure(lambda x: torch.equal(x, x), [torch.randn(3)], CPU)
    assert found is not None and "aten::equal (its result is read back to the host)" in found
    found = explain_capture_failure(lambda x: torch.unique(x), [torch.randn(3)], CPU)
    assert found is not None and "output size depends on the data" in found
    index = torch.tensor([0, 2])  # integer indexing has a fixed size: not a suspect
    assert explain_capture_failure(lambda x: x[index], [torch.randn(4)], CPU) is None


def test_a_submodule_returning_a_non_tensor_tree_is_left_eager_not_a_load_failure() -> None:
    """torchvision's detection transform returns an ImageList: recording its calls raised
    'ModelSourceError: an output is a ImageList' and failed the whole GPU load."""
    from qkan_pack.runtime._submodules import SubmoduleGraphs

    class Boxed:
        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

    class Wrap(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Boxed:
            return Boxed(x * 2)

    recorder = SubmoduleGraphs("transform", Wrap())
    recorder.recording = 0
    handle = recorder.module.register_forward_hook(recorder.hook, with_kwargs=True)
    try:
        recorder.module(torch.randn(2))
    finally:
        handle.remove()
    assert recorder.refusal.startswith("returns a Boxed") and not recorder.calls.get(0)


def test_a_submodule_call_splits_into_its_signature_its_tensors_and_a_rebuild() -> None:
    """What a submodule graph is keyed by (each argument's place, and a tensor's shape, dtype,
    strides and device or a constant's value) and how its call is rebuilt around the graph's
    own tensors: positional arguments in order, keywords by name."""
    from qkan_pack.runtime._submodules import _split_arguments

    x, mask = torch.randn(2, 3), torch.ones(4)
    key, tensors, rebuild = _split_arguments((x, 3), {"mask": mask, "flag": True})
    assert key == (("arg", 0, (2, 3), torch.float32, (3, 1), x.device), ("arg", 1, "const", 3),
                   ("kw", "flag", "const", True), ("kw", "mask", (4,), torch.float32, (1,), mask.device))
    assert tensors[0] is x and tensors[1] is mask
    fresh = [torch.zeros(2, 3), torch.zeros(4)]
    args, kwargs = rebuild(fresh)
    assert args[0] is fresh[0] and args[1] == 3
    assert list(kwargs) == ["flag", "mask"] and kwargs["flag"] is True and kwargs["mask"] is fresh[1]
    assert _split_arguments((x, [1, 2]), {}) == (None, [], None)  # a list: no signature
