"""Reference outputs: the model run on the reference inputs, checked and serialised.

Each declared shape runs twice: the two results must agree exactly (a forward that samples
or drops out in eval mode cannot be replayed) and be finite (a reference must be able to
tell a wrong model from a right one)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from ..errors import ModelSourceError
from ..format import OutputNode, Shape, format_shape
from ..runtime import describe_output, flatten, model_code_failed

#: Words of a failure caused by an input's dtype (an embedding given floats, a half-precision
#: model given float32): such a failure gets a word on how dtypes are declared.
_DTYPE_FAILURE = re.compile(r"dtype|scalar type|Input type|Expected tensor for argument|"
                            r"(Half|BFloat16|Float|Double|Long|Int)Tensor|"
                            r"c10::(Half|BFloat16|Float|Double|Long)")


def run_reference(forward: Callable[..., Any], inputs: Mapping[str, torch.Tensor],
                  shape_map: Mapping[str, Shape], model_path: Path,
                  dtypes: Mapping[str, str] | None = None) -> Any:
    """The forward's output on ``inputs`` (declared order), after the two checks."""
    label = ",".join(format_shape(s) for s in shape_map.values())
    try:
        with torch.inference_mode():
            first = forward(*inputs.values())
            second = forward(*inputs.values())
    except Exception as exc:
        error = model_code_failed("build forward", str(model_path), f"forward on shape {label}",
                                  exc, beside=os.path.dirname(model_path))
        floats = [name for name, dtype in (dtypes or {}).items() if "float" in dtype]
        if floats and "indices" in str(exc) and "embedding" in str(exc):
            error = ModelSourceError(
                f"{error}. An embedding was given floats: declare token ids as integers, "
                f"--dtype int64 (or --input NAME:SHAPES:int64); the float inputs were "
                f"{', '.join(floats)}",
                stage=error.stage, path=error.path)
        elif dtypes and _DTYPE_FAILURE.search(str(exc)):
            error = ModelSourceError(f"{error}. {dtype_hint(dtypes)}", stage=error.stage,
                                     path=error.path)
        raise error from exc
    # refuses caches and other non-tensor state with a fix to try, and outputs one name
    # would stand for twice
    structure = describe_output(first)
    refuse_name_clashes(structure, model_path, label)
    refuse_layouts(structure, flatten(first), model_path, label)
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


def refuse_name_clashes(structure: OutputNode, model_path: Path, label: str) -> None:
    """Two outputs that ``OutputNode.leaf_names`` names alike (``{"a.b": y, "a": {"b": z}}``)
    would be one output to ``predict``'s files and another to the protocol's reply: refused."""
    for name, first, second in structure.name_clashes()[:1]:
        raise ModelSourceError(
            f"{model_path}: forward on shape {label} returns two outputs named {name}: "
            f"{first} and {second}. Outputs are named by their keys joined with '.' (and "
            "indices as [i]) in predict's files, GET / and the Open Inference Protocol, so "
            "every name must differ: rename one of the keys", stage="build forward",
            path=str(model_path))


def refuse_layouts(structure: OutputNode, leaves: Sequence[torch.Tensor], model_path: Path,
                   label: str) -> None:
    """Every output must be a dense (strided) tensor: a sparse or other layout is neither
    stored in safetensors, compared, sliced nor replayed from a graph's buffers, and torch's
    own refusal of the first op on one lists every backend it knows."""
    for name, leaf in zip(structure.leaf_names(), leaves):
        if leaf.layout != torch.strided:
            layout = str(leaf.layout).removeprefix("torch.")
            raise ModelSourceError(
                f"{model_path}: forward on shape {label} returns {name} as a {layout} tensor; "
                "qkan-pack serves dense tensors only: return it dense (.to_dense())",
                stage="build forward", path=str(model_path))


def dtype_hint(dtypes: Mapping[str, str]) -> str:
    """How input dtypes are declared, for a forward that failed on one."""
    declared = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
    return (f"The inputs were declared as {declared}: --dtype (or --input NAME:SHAPE:DTYPE, "
            "dtype={name: dtype} in Python) sets the input dtypes only, e.g. int64 for token "
            "ids; a model whose weights have another dtype is cast in its build_model "
            "(model.to(torch.float16))")


def reference_bytes(inputs: Mapping[str, torch.Tensor], outputs: Any) -> bytes:
    """Inputs as ``input.<name>``, output leaves as ``output.<i>``, in one safetensors file."""
    tensors = {f"input.{name}": t.contiguous() for name, t in inputs.items()}
    for index, leaf in enumerate(flatten(outputs)):
        tensors[f"output.{index}"] = leaf.detach().contiguous().clone()
    return save(tensors, metadata={"format": "pt"})
