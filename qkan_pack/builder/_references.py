"""Reference outputs: the model run on the reference inputs, checked and serialised.

Each declared shape runs twice: the two results must agree exactly (a forward that samples
or drops out in eval mode cannot be replayed) and be finite (a reference must be able to
tell a wrong model from a right one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from ..errors import ModelSourceError
from ..format import Shape, format_shape
from ..runtime import describe_output, flatten, model_code_failed


def run_reference(forward: Callable[..., Any], inputs: Mapping[str, torch.Tensor],
                  shape_map: Mapping[str, Shape], model_path: Path) -> Any:
    """The forward's output on ``inputs`` (declared order), after the two checks."""
    label = ",".join(format_shape(s) for s in shape_map.values())
    try:
        with torch.inference_mode():
            first = forward(*inputs.values())
            second = forward(*inputs.values())
    except Exception as exc:
        raise model_code_failed("build forward", str(model_path), f"forward on shape {label}",
                                exc) from exc
    describe_output(first)  # refuses caches and other non-tensor state with a fix to try
    for index, (a, b) in enumerate(zip(flatten(first), flatten(second))):
        if a.is_floating_point() and not torch.isfinite(a).all():
            raise ModelSourceError(
                f"{model_path}: forward on shape {label} returned NaN/inf in output {index}; "
                "a reference must be finite (check the weights or --input-range)"
            )
        if not torch.equal(a, b):
            raise ModelSourceError(
                f"{model_path}: forward on shape {label} is not deterministic in eval mode "
                f"(output {index} differs between two runs): remove dropout/sampling from eval"
            )
    return first


def reference_bytes(inputs: Mapping[str, torch.Tensor], outputs: Any) -> bytes:
    """Inputs as ``input.<name>``, output leaves as ``output.<i>``, in one safetensors file."""
    tensors = {f"input.{name}": t.contiguous() for name, t in inputs.items()}
    for index, leaf in enumerate(flatten(outputs)):
        tensors[f"output.{index}"] = leaf.detach().contiguous().clone()
    return save(tensors, metadata={"format": "pt"})
