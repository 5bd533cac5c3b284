"""The Open Inference Protocol (KServe v2; Triton Inference Server's HTTP/REST and gRPC API)
over a replica's model: what Triton's and KServe's clients, gateways and load tools speak.

This module holds the protocol's data (metadata, requests, replies) with no HTTP or gRPC in
it: ``_http`` routes ``/v2/...`` here, ``_oip_grpc`` maps the gRPC messages onto the same
requests and replies. Both reach the model through ``ModelCore.infer``, the path of the JSON
route, so token, admission, limits, strict input checks and batching are the same.

Tensors travel as JSON ``data`` (a list, flat or nested, row-major) or, with the binary tensor
data extension, as raw little-endian bytes after the JSON header (``Inference-Header-Content-
Length``; per tensor ``"parameters": {"binary_data_size": n}``). Output names are the
manifest's leaf names (``output``, ``output.logits``, ``output[0]``), as ``GET /`` shows them.
The JSON is read as ``POST /``'s body is (``_wire.decode_body``: duplicate keys refused), and
values as ``_wire`` reads them (integers within their datatype, bool bytes 0 or 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from ..errors import MalformedRequestError
from ..format import DTYPES, MAX_RANK, Manifest
from ..runtime import wire_values
from ._wire import (
    Given,
    decode_body,
    header_count,
    is_tensor,
    map_leaves,
    parse_tensor,
    tensor_bits,
)

#: The protocol's name for each manifest dtype, and back (``DTYPES``' ``oip`` column).
OIP_DATATYPE = {name: spec.oip for name, spec in DTYPES.items()}
BINARY_HEADER = "inference-header-content-length"
EXTENSIONS = ("binary_tensor_data",)
#: Triton's repository extension: a repository's router serves it whole; one artifact's
#: server its index, refusing load and unload (``FIXED_MODEL``).
REPOSITORY_EXTENSION = "model_repository"
#: Why a server of one artifact loads and unloads nothing.
FIXED_MODEL = ("this server serves one artifact, so it loads and unloads no model (as Triton "
               "with model control 'none'): serve a model repository (qkan-pack serve REPO, "
               "REPO/<name>/<version>/) to load and unload")
PLATFORM = "qkan-pack"
#: What an inference request looks like, for the messages that refuse one.
REQUEST_SHAPE = '{"inputs": [{"name", "shape", "datatype", "data"}, ...]}'
#: Binary requests' JSON headers kept parsed for their next use, and the largest kept: a
#: client (tritonclient, perf_analyzer) sends the same header, byte for byte, for every
#: request of one shape, and parsing and checking it is most of what a binary request costs.
CACHED_HEADERS = 256
CACHED_HEADER_BYTES = 4096
#: Reply headers kept per cached request header (one per output shapes seen).
CACHED_REPLIES = 16


@dataclass(frozen=True)
class TensorMeta:
    """One input or output as the protocol's metadata describes it (-1 where it varies)."""

    name: str
    dtype: str  # manifest dtype
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": OIP_DATATYPE[self.dtype], "shape": list(self.shape)}


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass
class InferRequest:
    """One parsed ``infer`` request: inputs as wire inputs (``Given``), which outputs to send
    and how."""

    inputs: dict[str, Given]
    id: str | None = None
    outputs: list[RequestedOutput] | None = None  # None: every output
    binary_outputs: bool = False  # ``binary_data_output`` (the default for unlisted outputs)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    #: The parsed header it came with, when that is kept (``HeaderPlan``): its replies' headers.
    plan: HeaderPlan | None = None


@dataclass
class HeaderPlan:
    """A binary request's JSON header (``OipModel.parse_http``), or a gRPC request's fields
    other than its raw tensors (``_grpc_wire``), parsed and checked once: each input's
    name, dtype, shape and binary size in order, what the request asks of the reply, and
    the reply heads made for it so far (in the request's protocol), by output shapes. Only
    requests whose every input is binary are kept: one that holds values is not worth it."""

    inputs: list[tuple[str, str, list[int], int, str]]
    binary_bytes: int
    id: str | None
    outputs: list[RequestedOutput] | None
    binary_outputs: bool
    parameters: Mapping[str, Any]
    replies: dict[tuple[Any, ...], bytes] = field(default_factory=dict)

    def one_output_head(self, outputs: Any) -> bytes | None:
        """The kept reply head for a model's one output (an array, which ``output_values``
        names "output") of its shape; None for other outputs or one not kept yet."""
        if type(outputs) is not np.ndarray:
            return None
        return self.replies.get((("output", outputs.shape),))

    def keep_reply(self, shapes: tuple[Any, ...], head: bytes) -> None:
        """Keep the reply head made for outputs of ``shapes`` while there is room."""
        if len(self.replies) < CACHED_REPLIES:
            self.replies[shapes] = head

    def request(self, binary: memoryview) -> InferRequest:
        """The request with these binary tensors (``binary_bytes`` long), one after another."""
        pieces, offset = [], 0
        for *_, size, _ in self.inputs:
            pieces.append(binary[offset:offset + size])
            offset += size
        return self.request_of(pieces)

    def fits(self, pieces: Sequence[bytes | memoryview]) -> bool:
        """``pieces`` are one tensor per input, each of its size (gRPC's raw contents)."""
        return len(pieces) == len(self.inputs) and all(
            len(piece) == entry[3] for piece, entry in zip(pieces, self.inputs))

    def request_of(self, pieces: Sequence[bytes | memoryview]) -> InferRequest:
        """The request with these tensors, one per input in order (each input's size was
        checked against its shape and dtype when the plan was made)."""
        inputs: dict[str, Given] = {}
        for (name, dtype, shape, _, where), piece in zip(self.inputs, pieces):
            inputs[name] = Given(wire_values(piece, dtype, where, name).reshape(shape), dtype)
        return InferRequest(inputs, self.id, self.outputs, self.binary_outputs, self.parameters,
                            self)


def keep_plan(plans: dict[bytes, HeaderPlan], key: bytes, plan: HeaderPlan) -> HeaderPlan:
    """``plan`` kept under ``key`` among at most ``CACHED_HEADERS`` (the oldest makes room)."""
    if len(plans) >= CACHED_HEADERS:
        plans.pop(next(iter(plans)))
    plans[key] = plan
    return plan


def merged_shape(shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """One shape for a tensor declared at several: a dimension that differs between them
    (or a rank that does) is ``-1``, as the protocol writes a variable dimension."""
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1:
        return (-1,)
    return tuple(dims[0] if len(set(dims)) == 1 else -1 for dims in zip(*shapes))


class OipModel:
    """The protocol's view of one artifact: its name and version, metadata, and the
    conversion of requests and replies. ``batched``: the server gathers single rows into
    captured batches, so the first dimension of every input and output varies."""

    def __init__(self, manifest: Manifest, name: str, version: str, *, batched: bool,
                 server_version: str) -> None:
        self.name, self.version = name, version
        self.server_version = server_version
        self.input_names = manifest.input_names
        entries = manifest.shapes
        self.inputs = [TensorMeta(decl.name, decl.dtype, self._varying(
            [dict(e.inputs)[decl.name] for e in entries], batched)) for decl in manifest.inputs]
        by_name: dict[str, list[tuple[int, ...]]] = {}
        dtypes: dict[str, str] = {}
        for entry in entries:
            for leaf, spec in zip(entry.outputs.leaf_names(), entry.outputs.leaves()):
                by_name.setdefault(leaf, []).append(tuple(spec.shape))
                dtypes[leaf] = spec.dtype
        self.outputs = [TensorMeta(leaf, dtypes[leaf], self._varying(shapes, batched))
                        for leaf, shapes in by_name.items()]
        self._dtypes = {t.name: t.dtype for t in self.inputs}
        self._output_index = {t.name: i for i, t in enumerate(self.outputs)}
        self._plans: dict[bytes, HeaderPlan] = {}


    def __getstate__(self) -> dict[str, Any]:
        """Pickled for the wire helper without the kept request headers (the helper keeps
        none; a large body's job should not carry them)."""
        return {**self.__dict__, "_plans": {}}

    @staticmethod
    def _varying(shapes: Sequence[Sequence[int]], batched: bool) -> tuple[int, ...]:
        shape = merged_shape(shapes)
        return (-1, *shape[1:]) if batched and shape else shape

    # -- metadata -----------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        return {"name": PLATFORM, "version": self.server_version,
                "extensions": [*EXTENSIONS, REPOSITORY_EXTENSION]}

    def index(self) -> list[dict[str, str]]:
        """Triton's repository index of a server of this one model (Triton's with model
        control ``none``): the model, ready."""
        return [{"name": self.name, "version": self.version, "state": "READY", "reason": ""}]

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "versions": [self.version], "platform": PLATFORM,
                "inputs": [t.to_dict() for t in self.inputs],
                "outputs": [t.to_dict() for t in self.outputs]}

    def config(self) -> dict[str, Any]:
        """Triton's model configuration (``GET .../config``), the fields its clients read:
        shapes as declared (``max_batch_size`` 0: the batch dimension is part of them)."""
        def tensors(items: Sequence[TensorMeta]) -> list[dict[str, Any]]:
            return [{"name": t.name, "data_type": f"TYPE_{OIP_DATATYPE[t.dtype]}",
                     "dims": list(t.shape)} for t in items]

        return {"name": self.name, "platform": PLATFORM, "backend": PLATFORM,
                "version_policy": {"specific": {"versions": [self.version]}},
                "max_batch_size": 0, "input": tensors(self.inputs), "output": tensors(self.outputs)}

    def addresses(self, name: str, version: str | None) -> bool:
        """Whether ``/v2/models/{name}[/versions/{version}]`` is this model."""
        return name == self.name and version in (None, "", self.version)

    def unknown_model(self, name: str, version: str | None) -> str:
        asked = name if not version else f"{name} version {version}"
        return f"unknown model {asked!r}; this server serves {self.name!r} version {self.version}"

    # -- requests -----------------------------------------------------------------------

    def parse_http(self, body: bytes, header_length: str | None) -> InferRequest:
        """An HTTP ``infer`` body: JSON alone, or (binary extension) ``header_length`` bytes
        of JSON followed by the binary tensors in the order of the inputs that declare a
        ``binary_data_size``."""
        if header_length is None:
            header, binary = body, b""
        else:
            split = header_count(header_length)
            if split is None or split > len(body):
                raise MalformedRequestError(
                    f"Inference-Header-Content-Length {header_length[:40]!r} is not a byte "
                    f"count within the {len(body)}-byte body: send the JSON header's length "
                    "in ASCII digits")
            if (planned := self._planned(body, split)) is not None:
                return planned
            header, binary = body[:split], body[split:]
        request = decode_body(header, _key_count, hint=f"; send {REQUEST_SHAPE}")
        parsed = self._request(request, memoryview(binary))
        if header_length is not None and len(header) <= CACHED_HEADER_BYTES:
            parsed.plan = self._keep(header, request, parsed, len(binary))
        return parsed

    def _planned(self, body: bytes, split: int | None) -> InferRequest | None:
        """The request when its first ``split`` bytes are a kept JSON header (``HeaderPlan``)
        and the binary tensors after it are the size that header declares: the common
        binary request, read without parsing JSON. None otherwise (``parse_http`` reads it
        and says what is wrong)."""
        if split is None or (plan := self._plans.get(body[:split])) is None:
            return None
        if len(body) - split != plan.binary_bytes:
            return None
        return plan.request(memoryview(body)[split:])

    def _keep(self, header: bytes, request: dict[str, Any], parsed: InferRequest,
              binary_bytes: int) -> HeaderPlan | None:
        """The plan of a header that parsed and checked (the oldest kept one makes room),
        or None when an input came as JSON values."""
        inputs = []
        for index, tensor in enumerate(request["inputs"]):
            size = (tensor.get("parameters") or {}).get("binary_data_size")
            if size is None:
                return None
            name = tensor["name"]
            inputs.append((name, self._dtypes[name], tensor["shape"], size, f"inputs[{index}]"))
        return keep_plan(self._plans, header, HeaderPlan(
            inputs, binary_bytes, parsed.id, parsed.outputs, parsed.binary_outputs,
            parsed.parameters))

    def _request(self, request: Any, binary: memoryview) -> InferRequest:
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
            raise MalformedRequestError(f"an inference request is a JSON object: {REQUEST_SHAPE}")
        parameters = _parameters(request.get("parameters"), "parameters")
        request_id = request.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise MalformedRequestError('"id" must be a string')
        inputs: dict[str, Given] = {}
        offset = 0
        for index, tensor in enumerate(request["inputs"]):
            name, given, used = self._input(tensor, f"inputs[{index}]", binary[offset:])
            if name in inputs:
                raise MalformedRequestError(f"input {name!r} appears twice")
            inputs[name] = given
            offset += used
        if offset != len(binary):
            raise MalformedRequestError(f"the body holds {len(binary) - offset} bytes of binary "
                                        "data beyond those the inputs' binary_data_size declare")
        self.check_complete(inputs)
        return InferRequest(inputs, request_id, self._requested(request.get("outputs")),
                            _flag(parameters, "binary_data_output", "parameters"), parameters)

    def _input(self, tensor: Any, where: str, binary: memoryview) -> tuple[str, Given, int]:
        """(name, wire input, binary bytes used) for one request input."""
        if not isinstance(tensor, dict):
            raise MalformedRequestError(f"{where} must be an object with name, shape, datatype")
        name: Any = tensor.get("name")  # as sent: input_dtype and check_shape judge them
        shape: Any = tensor.get("shape")
        want = self.input_dtype(name, tensor.get("datatype"), where)
        self.check_shape(shape, name, where)
        size = _parameters(tensor.get("parameters"), f"{where}.parameters").get("binary_data_size")
        if size is None:
            if "data" not in tensor:
                raise MalformedRequestError(f"{where} ({name}): no \"data\" and no binary_data_size")
            return name, self._json_tensor(tensor["data"], shape, name, where), 0
        if "data" in tensor:
            raise MalformedRequestError(f"{where} ({name}): both \"data\" and binary_data_size")
        return name, binary_tensor(binary, size, shape, want, name, where), size

    def input_dtype(self, name: Any, datatype: Any, where: str) -> str:
        """The manifest dtype of input ``name`` sent as ``datatype``; refused unless both fit."""
        if not isinstance(name, str) or name not in self._dtypes:
            raise MalformedRequestError(f"{where}: unknown input {name!r}; {self.name} takes "
                                        f"{list(self.input_names)}")
        want = self._dtypes[name]
        if datatype != OIP_DATATYPE[want]:
            raise MalformedRequestError(f"{where} ({name}): datatype {datatype!r}; this input "
                                        f"takes {OIP_DATATYPE[want]}")
        return want

    @staticmethod
    def check_shape(shape: Any, name: str, where: str) -> None:
        if (not isinstance(shape, list) or len(shape) > MAX_RANK
                or not all(type(d) is int and 0 <= d < 2**31 for d in shape)):
            raise MalformedRequestError(f"{where} ({name}): shape must be a list of at most "
                                        f"{MAX_RANK} non-negative integers")

    def check_complete(self, inputs: Mapping[str, Given]) -> None:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise MalformedRequestError(f"missing input(s) {missing}; {self.name} takes "
                                        f"{list(self.input_names)}")

    def output_dtype(self, name: str) -> str:
        """The manifest dtype of output ``name``."""
        return self.outputs[self._output_index[name]].dtype

    def check_outputs(self, names: Sequence[Any]) -> None:
        seen = set()
        for index, name in enumerate(names):
            if isinstance(name, str) and name in seen:
                raise MalformedRequestError(f"outputs[{index}]: {name!r} is requested twice")
            seen.add(name if isinstance(name, str) else None)
            if not isinstance(name, str) or name not in self._output_index:
                raise MalformedRequestError(
                    f"outputs[{index}]: unknown output {name!r}; {self.name} returns "
                    f"{[t.name for t in self.outputs]}")

    @staticmethod
    def _json_tensor(data: Any, shape: list[int], name: str, where: str) -> Given:
        """JSON ``data``: the protocol's list of values (flat or nested, row-major), never
        ``POST /``'s base64 object, whose own dtype the input's ``datatype`` would not see."""
        if not isinstance(data, list):
            raise MalformedRequestError(
                f"{where} ({name}): \"data\" must be a list of the values, flat or nested in "
                f"row-major order, not {_json_kind(data)}; send raw bytes with the binary "
                "tensor data extension (\"parameters\": {\"binary_data_size\": N})")
        given = parse_tensor(data, f"{where} ({name}).data")
        if given.array.size != math.prod(shape):
            raise MalformedRequestError(f"{where} ({name}): shape {shape} holds {math.prod(shape)} "
                                        f"values, data has {given.array.size}")
        return Given(reshaped(given.array, shape, name, where), None)

    def _requested(self, outputs: Any) -> list[RequestedOutput] | None:
        if outputs is None:
            return None
        if not isinstance(outputs, list):
            raise MalformedRequestError('"outputs" must be a list of {"name": ...} objects')
        self.check_outputs([item.get("name") if isinstance(item, dict) else None
                            for item in outputs])
        requested = []
        for index, item in enumerate(outputs):
            name = item["name"]
            binary = _parameters(item.get("parameters"), f"outputs[{index}].parameters")
            requested.append(RequestedOutput(name, _flag(binary, "binary_data",
                                                         f"outputs[{index}].parameters")))
        return requested

    # -- replies ------------------------------------------------------------------------

    def output_values(self, outputs: Any, request: InferRequest
                      ) -> list[tuple[str, np.ndarray, str]]:
        """(name, host values, manifest dtype) of each output the request asked for, in its
        order (all of them, in the order the model returned them, when it named none). Names
        come from the outputs themselves (``runtime.leaf_names_of``): the shapes an artifact
        declares may return different structures, and the one that ran decides."""
        leaves: list[Any] = []
        if type(outputs) is np.ndarray:  # the common reply: one output
            named = {"output": outputs}
        else:
            from ..runtime import leaf_names_of  # the replica has torch; the helper never calls this

            map_leaves(leaves.append, outputs)
            named = dict(zip(leaf_names_of(outputs), leaves))
        names = [o.name for o in request.outputs] if request.outputs else list(named)
        missing = [name for name in names if name not in named]
        if missing:
            raise MalformedRequestError(
                f"output(s) {missing} are not returned for this request's shape (it returns "
                f"{list(named)}): leave them out of \"outputs\"")
        return [(name, _host_values(named[name]), self.output_dtype(name)) for name in names]

    def reply(self, outputs: Any, request: InferRequest) -> tuple[bytes, int | None]:
        """(body, JSON header length when binary tensors follow it, else None). The header
        of an all-binary reply to a kept request header is kept too, by output shapes."""
        head = None if request.plan is None else request.plan.one_output_head(outputs)
        if head is not None:  # the common reply: one output, its head kept
            return head + raw_bytes(outputs, self.output_dtype("output")), len(head)
        produced = self.output_values(outputs, request)
        # keyed by names and shapes: shapes an artifact declares may return other outputs
        plan, shapes = request.plan, tuple([(name, v.shape) for name, v, _ in produced])
        if plan is not None and (head := plan.replies.get(shapes)) is not None:
            return b"".join([head, *[raw_bytes(v, dtype) for _, v, dtype in produced]]), len(head)
        binary = {o.name: o.binary for o in request.outputs or ()}
        described, blobs = [], []
        for name, values, dtype in produced:
            entry: dict[str, Any] = {"name": name, "datatype": OIP_DATATYPE[dtype],
                                     "shape": list(values.shape)}
            if binary.get(name, request.binary_outputs):
                raw = raw_bytes(values, dtype)
                entry["parameters"] = {"binary_data_size": len(raw)}
                blobs.append(raw)
            else:
                entry["data"] = _json_values(values, dtype)
            described.append(entry)
        header = orjson.dumps(self._reply_head(request, described),
                              option=orjson.OPT_SERIALIZE_NUMPY)
        if not blobs:
            return header, None
        if plan is not None and len(blobs) == len(produced):
            plan.keep_reply(shapes, header)
        return b"".join((header, *blobs)), len(header)

    def _reply_head(self, request: InferRequest, outputs: list[dict[str, Any]]) -> dict[str, Any]:
        head: dict[str, Any] = {"model_name": self.name, "model_version": self.version}
        if request.id is not None:
            head["id"] = request.id
        head["outputs"] = outputs
        return head


def control_body(body: bytes) -> dict[str, Any] | str:
    """A repository request's JSON object (an empty body is ``{}``), or what is wrong with
    it (Triton's index, load and unload requests)."""
    if not body.strip():
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"the body is not JSON: {exc}"
    return data if isinstance(data, dict) else "the body is not a JSON object"


def ready_only(body: bytes) -> bool | str:
    """The index request's ``ready`` flag (Triton's ``{"ready": true}``: ready ones only),
    or what is wrong with the body."""
    data = control_body(body)
    if isinstance(data, str):
        return data
    ready = data.get("ready", False)
    return ready if isinstance(ready, bool) else '"ready" is true or false'


def _key_count(request: Any) -> int:
    """Keys of the objects an inference request holds (the request and its parameters, each
    input and output and their parameters): with no duplicate key and no colon inside a
    string, the JSON has exactly this many colons (``_wire.decode_body``). Each key counted
    belongs to a distinct object of the request, so a count that matches proves no key was
    repeated. Plain loops and ``type`` tests: this runs once per request."""
    if type(request) is not dict:
        return 0
    count = len(request)
    for key in ("parameters", "inputs", "outputs"):
        value = request.get(key)
        if type(value) is dict:
            count += len(value)
        elif type(value) is list:
            for item in value:
                if type(item) is dict:
                    count += len(item)
                    parameters = item.get("parameters")
                    if type(parameters) is dict:
                        count += len(parameters)
    return count


def _json_kind(value: Any) -> str:
    """What a JSON value is, in the words of the format (for messages)."""
    return {dict: "an object", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _parameters(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedRequestError(f"{where} must be an object")
    return value


def binary_tensor(binary: memoryview, size: Any, shape: list[int], dtype: str, name: str,
                  where: str, sent: str = "binary_data_size") -> Given:
    """Raw little-endian bytes as a wire input of the declared dtype (bfloat16: its bits).
    ``sent`` names where ``size`` came from (HTTP's ``binary_data_size`` parameter, gRPC's
    ``raw_input_contents[i]``) for the refusal of a size the shape and dtype do not make."""
    wire = np.dtype(DTYPES[dtype].wire)
    count = math.prod(shape)
    expected = count * wire.itemsize
    if type(size) is not int or size != expected:
        received = f"is {size} bytes" if type(size) is int else f"is {size!r}, not a byte count"
        raise MalformedRequestError(
            f"{where} ({name}): {sent} {received}; shape {shape} of {OIP_DATATYPE[dtype]} "
            f"takes {expected} ({count} values x {wire.itemsize} "
            f"byte{'s' if wire.itemsize > 1 else ''})")
    if len(binary) < size:
        raise MalformedRequestError(f"{where} ({name}): {size} binary bytes declared, "
                                    f"{len(binary)} left in the body")
    array = reshaped(wire_values(binary[:size], dtype, where, name), shape, name, where)
    return Given(array, dtype)


def reshaped(array: np.ndarray, shape: list[int], name: str, where: str) -> np.ndarray:
    """``array`` in ``shape``; a shape numpy cannot make (a zero-size one whose other
    dimensions overflow its size type) is the request's fault."""
    try:
        return array.reshape(shape)
    except ValueError as exc:
        raise MalformedRequestError(f"{where} ({name}): shape {shape} cannot hold the data "
                                    f"({exc})") from None


def _flag(parameters: Mapping[str, Any], key: str, where: str) -> bool:
    """A boolean parameter: true or false as JSON booleans, never a string or a number."""
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise MalformedRequestError(f"{where}.{key} must be true or false, not {value!r}")
    return value


def _host_values(leaf: Any) -> np.ndarray:
    """An output leaf as a numpy array (a bfloat16 tensor as its raw 16 bits)."""
    if is_tensor(leaf):
        return tensor_bits(leaf)
    return np.asarray(leaf)


#: Each manifest dtype's little-endian wire dtype, made once.
_WIRE = {name: np.dtype(spec.wire) for name, spec in DTYPES.items()}


def raw_bytes(values: np.ndarray, dtype: str) -> bytes:
    """``values`` as the protocol's raw bytes: little-endian, row-major."""
    wire = _WIRE[dtype]
    return (values if values.dtype == wire else values.astype(wire)).tobytes()


def _json_values(values: np.ndarray, dtype: str) -> Any:
    """Row-major flat values for JSON (bfloat16 bits widened to the floats they are)."""
    if dtype == "bfloat16":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(values).reshape(-1)
