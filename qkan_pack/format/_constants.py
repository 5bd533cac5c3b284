"""Format constants: names, limits, and the one dtype table every layer derives from.

A dtype's manifest name is also its ``torch`` attribute name (``torch.float32``) and its
numpy name, so the runtime maps names to torch dtypes with ``getattr`` and nothing else
keeps a second table.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

FORMAT_NAME = "qkan-pack"
#: The newest format version this qkan-pack reads and writes. A key added to the manifest
#: comes with a new version, declared on its field (``json_field(since=...)``); the writer
#: writes the lowest version that holds every key a manifest uses (docs/artifacts.md,
#: "Versions").
FORMAT_VERSION = 3
#: The version of every manifest key that declares no later one: the oldest version the
#: writer writes (format 1 is read, through ``_old/v1``, never written).
BASE_FORMAT_VERSION = 2
MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "weights.safetensors"
#: The optional signature (``qkan-pack sign``): a Sigstore bundle over every other file. Not
#: listed in the manifest (it signs the manifest); reserved, so no listed file may take it.
SIGNATURE_NAME = "model.sig"
MAX_SIGNATURE_BYTES = 1024 * 1024
SOURCE_DIR = "source"
REFERENCE_DIR = "references"
KERNELS_DIR = "kernels"
DIGEST_PREFIX = "sha256:"
#: A sha256 digest as the manifest and ``expected_digest`` spell it: 64 lowercase hex digits.
SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_RANK = 8
MAX_DIM = 2**31 - 1
MAX_SHAPES = 256
#: Reference inputs a build may draw, all inputs of all declared shapes together: they are
#: held in memory while the build runs the model (and its float64 copy) on them, written
#: into the artifact and read back by every load. Declared shapes beyond it are refused
#: before anything is allocated.
MAX_REFERENCE_BYTES = 2**30
#: The largest ``--seed``: reference inputs of the shape at index i are drawn with seed
#: ``seed + i``, which ``torch.Generator.manual_seed`` takes below 2**64.
MAX_SEED = 2**63 - 1
CAPTURE_POLICIES = ("auto", "full", "submodules")


@dataclass(frozen=True)
class Precision:
    """One precision an artifact may compute in (``build --precision``).

    Weights stay float32 in the artifact whatever the precision: ``bf16``/``fp16`` run the
    forward under ``torch.autocast`` (matmuls and convolutions in the half dtype, reductions,
    softmax and norms kept in float32 by autocast's own op lists) and ``tf32`` lets cuBLAS and
    cuDNN round float32 matmul and convolution inputs to TensorFloat-32.
    """

    name: str
    autocast: str | None  # the DTYPES name autocast computes in; None: float32 tensors
    #: The unit roundoff of its arithmetic: how far another kernel for the same op (a graph's
    #: choice against eager's) may move a result, as a share of the output's scale.
    unit: float


PRECISIONS: Mapping[str, Precision] = {p.name: p for p in (
    Precision("fp32", None, 2.0**-24),
    Precision("tf32", None, 2.0**-11),
    Precision("bf16", "bfloat16", 2.0**-8),
    Precision("fp16", "float16", 2.0**-11),
)}
#: ``build --precision auto``: every precision within ``--max-error`` is allowed, float32 is
#: served until ``qkan-pack warm --precision auto`` records the fastest one per device.
AUTO_PRECISION = "auto"
#: ``--max-error`` when none is given: the largest difference from the float32 references a
#: reduced precision may make, as a share of each output's scale.
DEFAULT_MAX_ERROR = 1e-2
#: The memory layouts a graph may take its 4-D inputs and convolution weights in (torch's
#: ``memory_format``): ``contiguous`` (NCHW, what every model is built and called with) and
#: ``channels_last`` (NHWC, the layout tensor-core convolutions compute in natively). A
#: layout is a property of how a graph is captured, never of what a caller passes or gets.
CONTIGUOUS, CHANNELS_LAST = "contiguous", "channels_last"
LAYOUTS = (CONTIGUOUS, CHANNELS_LAST)
#: ``Predictor.load``'s ``compiled`` modes (``runtime._compiled``): ``auto`` (the default)
#: serves shipped AOTInductor packages where every shape has one for this host; ``off``
#: never compiles; ``shipped`` serves whatever ``warm --compiled`` shipped; ``on`` also
#: compiles at load when nothing is shipped.
COMPILED_MODES = ("auto", "off", "shipped", "on")
#: The loosest ``max_error`` an artifact may declare: beyond a tenth of an output's scale a
#: "reduced precision" model is another model.
MAX_MAX_ERROR = 0.1


@dataclass(frozen=True)
class DType:
    """One supported tensor dtype and how each file or wire format spells it."""

    name: str  # manifest name == torch attribute == numpy name (bfloat16 aside)
    safetensors: str  # safetensors header code
    wire: str  # numpy little-endian format on the serve wire; bfloat16 as raw 16 bits
    kind: str  # "float" | "int" | "bool"
    oip: str  # the Open Inference Protocol's (KServe v2, Triton) datatype name
    largest: float | None = None  # a float dtype's largest finite value

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def itemsize(self) -> int:
        """Bytes per element (the width in its wire code; 1 for bool)."""
        return int(self.wire[-1]) if self.wire[-1].isdigit() else 1

    @property
    def int_limits(self) -> tuple[int, int] | None:
        """Smallest and largest value of an integer dtype (from its wire code), else None."""
        if self.kind != "int":
            return None
        bits = 8 * int(self.wire[-1])
        return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if "i" in self.wire else (0, 2**bits - 1)


DTYPES: Mapping[str, DType] = {d.name: d for d in (
    DType("float16", "F16", "<f2", "float", "FP16", 65504.0),
    DType("bfloat16", "BF16", "<u2", "float", "BF16", 3.3895313892515355e38),
    DType("float32", "F32", "<f4", "float", "FP32", 3.4028234663852886e38),
    DType("float64", "F64", "<f8", "float", "FP64", sys.float_info.max),
    DType("uint8", "U8", "u1", "int", "UINT8"),
    DType("int8", "I8", "i1", "int", "INT8"),
    DType("int16", "I16", "<i2", "int", "INT16"),
    DType("int32", "I32", "<i4", "int", "INT32"),
    DType("int64", "I64", "<i8", "int", "INT64"),
    DType("bool", "BOOL", "?", "bool", "BOOL"),
)}
INTEGER_DTYPES = tuple(name for name, d in DTYPES.items() if d.kind == "int")
_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "long": "int64",
            "int": "int32"}


def dtype_alias(text: str) -> str:
    """``torch.float`` / ``Float`` / ``half`` ... -> the canonical spelling (unchecked)."""
    canonical = text.strip().lower().removeprefix("torch.")
    return _ALIASES.get(canonical, canonical)
