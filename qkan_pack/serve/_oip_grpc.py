"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService`` on Ray Serve's
gRPC ingress (``serve --grpc-port``), mapped onto the same requests and replies as HTTP
(``_oip``).

The protocol's messages come from ``tritonclient[grpc]``: NVIDIA's generated stubs of the
``inference`` package (Triton's superset of KServe's ``grpc_predict_v2.proto``, wire
compatible with both clients), so that server and clients speak one definition. Ray Serve
registers the service with ``add_inference_service`` and calls the replica's method named
after each RPC (``ServerLive``, ``ModelInfer``...) with the request message and a
``grpc_context``; methods the service has and this server does not implement answer
UNIMPLEMENTED. The bearer token travels as ``authorization: Bearer ...`` metadata.

Each ``ModelInfer`` (and any call refused for its token) is counted with its outcome and
latency (``answered``, protocol ``oip-grpc``): the status a call ends with is the outcome.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, MalformedRequestError, OverloadedError, ServeError
from ..format import DTYPES
from ..runtime import check_int_range
from ._auth import bearer_matches
from ._grpc_wire import KeptLayout, is_head_of, reply_bytes, request_head
from ._oip import (
    CACHED_HEADER_BYTES,
    CACHED_HEADERS,
    FIXED_MODEL,
    OIP_DATATYPE,
    HeaderPlan,
    InferRequest,
    OipModel,
    RequestedOutput,
    binary_tensor,
    keep_plan,
    raw_bytes,
    reshaped,
)
from ._statistics import statistics_message
from ._wire import Given

if TYPE_CHECKING:
    from types import ModuleType

    from ._http import Admission

#: What ``gRPCOptions.grpc_servicer_functions`` names (importable in every Ray process).
SERVICER_FUNCTION = "qkan_pack.serve._oip_grpc.add_inference_service"
#: The RPCs this server answers; the service's others (Triton's repository, statistics,
#: shared-memory and trace RPCs) answer UNIMPLEMENTED.
IMPLEMENTED = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
               "ModelInfer", "ModelConfig", "ModelStatistics")
#: The service's unary RPCs this server does not serve (Triton's repository control,
#: statistics, shared memory, trace and log settings): each answers UNIMPLEMENTED, never
#: Ray's UNKNOWN naming the replica's own methods. (Streaming inference is not served.)
UNSERVED = ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
            "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus", "CudaSharedMemoryRegister",
            "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings")
#: Triton's repository extension: one artifact's server lists its model and refuses load
#: and unload (``_oip.FIXED_MODEL``); a repository's router serves it whole.
REPOSITORY_RPCS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
#: A ``ModelInfer`` read through a kept head: its raw tensors and the head's plan.
Kept = tuple[list[memoryview], HeaderPlan]
#: The typed ``InferTensorContents`` field of each manifest dtype (half floats: raw only).
CONTENTS_FIELD = {"float32": "fp32_contents", "float64": "fp64_contents",
                  "int8": "int_contents", "int16": "int_contents", "int32": "int_contents",
                  "int64": "int64_contents", "uint8": "uint_contents", "bool": "bool_contents"}
#: The protobuf type of each such field, as numpy reads it (``int_contents`` holds any
#: int32, whatever the narrower datatype it carries).
FIELD_DTYPE = {"fp32_contents": np.float32, "fp64_contents": np.float64,
               "int_contents": np.int32, "int64_contents": np.int64,
               "uint_contents": np.uint32, "bool_contents": np.bool_}


def protocol() -> ModuleType:
    """``tritonclient.grpc.service_pb2``, or a ServeError saying what to install.

    Its messages name their module ``grpc_service_pb2`` (the name the stubs were generated
    under), which is not importable: Ray's own gRPC proxy pickles each request and reply to
    pass it to a replica, and pickle finds a class by its module's name. The stubs are
    therefore also registered under that name, in every process that handles the protocol
    (proxies through ``add_inference_service``, replicas when they start)."""
    try:
        from tritonclient.grpc import service_pb2
    except (ImportError, RuntimeError) as exc:  # tritonclient.grpc says RuntimeError for grpc
        raise ServeError(f"--grpc-port needs the protocol's gRPC stubs: {exc}",
                         hint="pip install 'qkan-pack[grpc]' (tritonclient[grpc])") from None
    sys.modules.setdefault(service_pb2.ModelInferRequest.__module__, service_pb2)
    return service_pb2


def add_inference_service(servicer: Any, server: Any) -> None:
    """Ray Serve's servicer function for ``inference.GRPCInferenceService``."""
    protocol()
    from tritonclient.grpc import service_pb2_grpc

    from ._ray_compat import route_grpc_calls

    route_grpc_calls()  # a model repository's calls naming no application: to its router
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


#: gRPC's server pushback (gRFC A6): trailing metadata telling a client how many
#: milliseconds to wait before it retries, as HTTP's ``Retry-After`` does.
PUSHBACK = "grpc-retry-pushback-ms"
#: A call's status as an outcome (``_stats.OUTCOMES``): unknown statuses are the server's.
OUTCOME_OF_STATUS = {None: "success", "OK": "success", "UNAUTHENTICATED": "unauthorized",
                     "UNAVAILABLE": "overloaded", "INVALID_ARGUMENT": "client_error",
                     "NOT_FOUND": "client_error", "UNIMPLEMENTED": "client_error"}


class _Call:
    """A call's context as the methods use it, remembering the status set on it (the
    context may be None: a call made without gRPC)."""

    __slots__ = ("code", "context")

    def __init__(self, context: Any) -> None:
        self.context, self.code = context, None

    def invocation_metadata(self) -> Any:
        return self.context.invocation_metadata() if self.context is not None else ()

    def set_code(self, code: Any) -> None:
        self.code = code
        if self.context is not None:
            self.context.set_code(code)

    def set_details(self, details: str) -> None:
        if self.context is not None:
            self.context.set_details(details)

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        if self.context is not None:
            self.context.set_trailing_metadata(metadata)


def add_rpc_methods(server: type) -> type:
    """Give the replica class ``server`` a method named after each RPC of the service
    (``IMPLEMENTED``, ``REPOSITORY_RPCS``, ``UNSERVED``), as Ray Serve calls them with the
    request message:
    each passes it to ``self.grpc.answer`` (``GrpcApi``, or a repository router's)."""
    def rpc_method(rpc: str) -> Callable[..., Any]:
        async def method(self: Any, request: Any, grpc_context: Any = None) -> Any:
            return await self.grpc.answer(rpc, request, grpc_context)

        method.__name__ = method.__qualname__ = rpc
        method.__doc__ = f"``{rpc}`` of the Open Inference Protocol over gRPC."
        return method

    for rpc in (*IMPLEMENTED, *REPOSITORY_RPCS, *UNSERVED):
        setattr(server, rpc, rpc_method(rpc))
    return server


class ForwardedCall:
    """The context of an RPC a model repository's router passes on over a handle: the
    caller's metadata, and the status the answer sets (sent back to the router, which
    sets it on the real call)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata
        self.code: Any = None
        self.details = ""
        self.trailing_metadata: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing_metadata = tuple(metadata)


class GrpcApi:
    """The replica's gRPC methods' bodies; the replica class forwards each RPC here."""

    def __init__(self, oip: OipModel, core: Any, token_sha256: str | None,
                 admission: Admission, retry_after_s: int, *,
                 infer: Callable[..., Any] | None = None,
                 answered: Callable[[str, float], None] | None = None,
                 statistics: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None
                 ) -> None:
        """``infer``: the model's inference (default ``core.infer``; the replica passes it
        with ``paced=True``: gRPC hands requests to the loop one at a time, ``_gather``);
        ``answered``: told each counted call's outcome and seconds; ``statistics``: the
        model's ``ModelStatistics`` entries (``_statistics``; none: UNIMPLEMENTED)."""
        self.oip, self.core, self.token_sha256 = oip, core, token_sha256
        self._statistics = statistics
        self.admission, self.retry_after_s = admission, retry_after_s
        self._infer = infer or core.infer
        self._answered = answered
        self.pb = protocol()
        #: Kept request heads (``_grpc_wire``), for requests that come with their bytes.
        self._plans: dict[bytes, HeaderPlan] = {}
        #: The same plans by the length of a whole request read through them (the latest
        #: kept of any one length), to read such a request without protobuf (``kept``).
        self._layouts: dict[int, tuple[KeptLayout, HeaderPlan]] = {}

    def authorized(self, context: Any) -> bool:
        """The call's ``authorization`` metadata carries the token (or none is required);
        else the status is UNAUTHENTICATED."""
        if self.token_sha256 is None:
            return True
        import grpc

        sent = next((v for k, v in (context.invocation_metadata() if context is not None else ())
                     if k.lower() == "authorization"), None)
        sent = sent.decode("latin-1") if isinstance(sent, bytes) else sent
        if sent is not None and bearer_matches(sent.encode("latin-1"), self.token_sha256):
            return True
        self.core.stats.request("unauthorized")
        _fail(context, grpc.StatusCode.UNAUTHENTICATED,
              "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'")
        return False

    def model_known(self, name: str, version: str, context: Any) -> bool:
        """The request names this model (any version, or this one); else NOT_FOUND."""
        import grpc

        if self.oip.addresses(name, version):
            return True
        _fail(context, grpc.StatusCode.NOT_FOUND, self.oip.unknown_model(name, version))
        return False

    async def answer(self, rpc: str, request: Any, context: Any,
                     payload: bytes | None = None, kept: Kept | None = None) -> Any:
        """One RPC: the token first, then (for a model's RPCs) the model's name and version,
        then the answer; a refusal is the RPC's empty reply with its status set. Counted
        (``answered``): every ``ModelInfer``, and any call refused for its token.
        ``payload``: the request's bytes as they came (the HTTP route's), with which a
        ``ModelInfer`` is read through a kept head and answered as the reply's bytes;
        ``kept``: what ``kept(payload)`` found for them (``request`` is then not needed)."""
        started = time.perf_counter()
        # a ForwardedCall keeps its status itself; grpc's own context needs _Call to tell it
        call = context if isinstance(context, ForwardedCall) else _Call(context)
        if kept is not None:  # its head names this model: it was checked when it was kept
            reply = (await self.infer(None, call, payload, kept) if self.authorized(call)
                     else self.pb.ModelInferResponse())
        else:
            reply = await self._answer(rpc, request, call, payload)
        name = getattr(call.code, "name", call.code)
        if self._answered is not None and (rpc == "ModelInfer" or name == "UNAUTHENTICATED"):
            self._answered(OUTCOME_OF_STATUS.get(name, "server_error"),
                           time.perf_counter() - started)
        return reply

    async def _answer(self, rpc: str, request: Any, context: Any, payload: bytes | None) -> Any:
        if rpc in REPOSITORY_RPCS:
            return self.repository(rpc, context)
        if rpc not in IMPLEMENTED or (rpc == "ModelStatistics" and self._statistics is None):
            return self.unimplemented(rpc, context)
        if not self.authorized(context):
            return getattr(self.pb, f"{rpc}Response")()
        if rpc == "ModelStatistics":
            return await self.model_statistics(request, context)
        if rpc.startswith("Model"):
            name, version = ((request.model_name, request.model_version) if rpc == "ModelInfer"
                             else (request.name, request.version))
            if not self.model_known(name, version, context):
                return getattr(self.pb, f"{rpc}Response")()
        if rpc == "ModelInfer":
            return await self.infer(request, context, payload)
        return self._answers[rpc]()

    async def model_statistics(self, request: Any, context: Any) -> Any:
        """``ModelStatistics``: this model's (every model's, when the request names none)."""
        assert self._statistics is not None
        if request.name and not self.model_known(request.name, request.version, context):
            return self.pb.ModelStatisticsResponse()
        return statistics_message(self.pb, await self._statistics())

    @property
    def _answers(self) -> dict[str, Callable[[], Any]]:
        pb = self.pb
        return {"ServerLive": lambda: pb.ServerLiveResponse(live=True),
                "ServerReady": lambda: pb.ServerReadyResponse(ready=True),
                "ModelReady": lambda: pb.ModelReadyResponse(ready=True),
                "ServerMetadata": self.server_metadata, "ModelMetadata": self.model_metadata,
                "ModelConfig": self.model_config}

    def unimplemented(self, rpc: str, context: Any) -> Any:
        """An RPC of the service this server does not serve: UNIMPLEMENTED (after the token,
        so that what is served is not told to callers without it)."""
        import grpc

        if self.authorized(context):
            _fail(context, grpc.StatusCode.UNIMPLEMENTED, f"{rpc} is not served by qkan-pack; "
                  "it serves ServerLive/Ready/Metadata, ModelReady/Metadata/Config/"
                  "Statistics, ModelInfer and RepositoryIndex")
        return getattr(self.pb, f"{rpc}Response")()  # never None: Ray's proxy serialises it

    def repository(self, rpc: str, context: Any) -> Any:
        """The repository extension's RPCs on one artifact (after the token): the index
        lists this model, ready; load and unload are INVALID_ARGUMENT (HTTP's 400)."""
        import grpc

        reply = getattr(self.pb, f"{rpc}Response")
        if not self.authorized(context):
            return reply()
        if rpc == "RepositoryIndex":
            return reply(models=[self.pb.RepositoryIndexResponse.ModelIndex(**entry)
                                 for entry in self.oip.index()])
        _fail(context, grpc.StatusCode.INVALID_ARGUMENT, FIXED_MODEL)
        return reply()

    def server_metadata(self) -> Any:
        meta = self.oip.server_metadata()
        return self.pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                              extensions=meta["extensions"])

    def model_metadata(self) -> Any:
        pb = self.pb

        def tensors(items: Any) -> list[Any]:
            return [pb.ModelMetadataResponse.TensorMetadata(
                name=t.name, datatype=OIP_DATATYPE[t.dtype], shape=list(t.shape)) for t in items]

        return pb.ModelMetadataResponse(name=self.oip.name, versions=[self.oip.version],
                                        platform="qkan-pack", inputs=tensors(self.oip.inputs),
                                        outputs=tensors(self.oip.outputs))

    def model_config(self) -> Any:
        from tritonclient.grpc import model_config_pb2 as mc

        config = self.oip.config()

        def tensors(items: list[dict[str, Any]], kind: Any) -> list[Any]:
            return [kind(name=t["name"], data_type=mc.DataType.Value(t["data_type"]),
                         dims=t["dims"]) for t in items]

        return self.pb.ModelConfigResponse(config=mc.ModelConfig(
            name=config["name"], platform=config["platform"], backend=config["backend"],
            max_batch_size=0, input=tensors(config["input"], mc.ModelInput),
            output=tensors(config["output"], mc.ModelOutput)))

    async def infer(self, request: Any, context: Any, payload: bytes | None = None,
                    kept: Kept | None = None) -> Any:
        """``ModelInfer`` within the replica's admission bounds (the HTTP routes' own: a full
        replica answers UNAVAILABLE at once, as HTTP answers 503, never an unbounded queue)."""
        import grpc

        try:
            await self.admission.acquire()
        except OverloadedError:
            self.core.stats.request("overloaded")
            _fail(context, grpc.StatusCode.UNAVAILABLE, "overloaded: this replica's queue is "
                  f"full; retry after {self.retry_after_s} s")
            if context is not None:  # gRPC's Retry-After: clients with a retry policy wait
                context.set_trailing_metadata(((PUSHBACK, str(self.retry_after_s * 1000)),))
            return self.pb.ModelInferResponse()
        try:  # one coroutine, not one per step: each costs the replica's loop per call
            if payload is None:
                parsed = self.parse(request)
                return self.reply(await self._infer(parsed.inputs), parsed)
            parsed = (self.planned(request, payload) if kept is None
                      else kept[1].request_of(kept[0]))
            return self.reply_bytes(await self._infer(parsed.inputs), parsed)
        except (MalformedRequestError, InputError) as exc:
            _fail(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:
            _fail(context, grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.admission.release()
        return self.pb.ModelInferResponse()

    def parse(self, request: Any) -> InferRequest:
        """A ``ModelInferRequest`` as the protocol's request (raw contents in input order,
        else each input's typed contents)."""
        raw = list(request.raw_input_contents)
        if raw and len(raw) != len(request.inputs):
            raise MalformedRequestError(f"{len(raw)} raw_input_contents for "
                                        f"{len(request.inputs)} inputs")
        inputs: dict[str, Given] = {}
        for index, tensor in enumerate(request.inputs):
            where = f"inputs[{index}]"
            want = self.oip.input_dtype(tensor.name, tensor.datatype, where)
            shape = [int(d) for d in tensor.shape]
            self.oip.check_shape(shape, tensor.name, where)
            if tensor.name in inputs:
                raise MalformedRequestError(f"input {tensor.name!r} appears twice")
            if raw and tensor.HasField("contents"):
                raise MalformedRequestError(f"{where} ({tensor.name}): send raw_input_contents "
                                            "or contents, not both")
            if raw:
                data = memoryview(raw[index])
                inputs[tensor.name] = binary_tensor(data, len(data), shape, want, tensor.name,
                                                    where, f"raw_input_contents[{index}]")
            else:
                inputs[tensor.name] = _typed_contents(tensor, shape, want, where)
        self.oip.check_complete(inputs)
        requested = [RequestedOutput(o.name, True) for o in request.outputs] or None
        if requested:
            self.oip.check_outputs([o.name for o in requested])
        return InferRequest(inputs, request.id or None, requested, True)

    def planned(self, request: Any, payload: bytes) -> InferRequest:
        """``parse(request)``, through the plan kept for the request's head when there is
        one (``_grpc_wire``); a request whose every input is raw has its head kept."""
        raws = request.raw_input_contents
        head = request_head(payload, raws)
        plan = self._plans.get(head)
        if plan is not None and plan.fits(raws):
            return plan.request_of(raws)
        parsed = self.parse(request)
        if raws and len(head) <= CACHED_HEADER_BYTES and is_head_of(request, head):
            self._keep(head, parsed, raws)
        return parsed

    def _keep(self, head: bytes, parsed: InferRequest, raws: Any) -> None:
        """Keep the plan of a request read from raw tensors (the oldest kept one makes
        room); ``parsed.plan`` is it."""
        inputs = [(name, given.dtype, list(given.array.shape), len(raw), f"inputs[{index}]")
                  for index, ((name, given), raw) in enumerate(zip(parsed.inputs.items(), raws))
                  if given.dtype is not None]  # raw tensors always carry their dtype
        if len(inputs) == len(raws):
            plan = parsed.plan = keep_plan(self._plans, head, HeaderPlan(
                inputs, sum(len(raw) for raw in raws), parsed.id, parsed.outputs, True, {}))
            layout = KeptLayout.of(head, [len(raw) for raw in raws])
            if len(self._layouts) >= CACHED_HEADERS:
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[layout.length] = (layout, plan)

    def kept(self, payload: bytes) -> Kept | None:
        """A ``ModelInfer``'s raw tensors and the plan of its kept head, read from its bytes
        alone (``KeptLayout``), or None when no kept head has its layout: the request is
        then parsed (``planned``)."""
        entry = self._layouts.get(len(payload))
        if entry is None:
            return None
        raws = entry[0].raws(payload)
        return None if raws is None else (raws, entry[1])

    def reply(self, outputs: Any, parsed: InferRequest) -> Any:
        """The ``ModelInferResponse`` message."""
        produced = self.oip.output_values(outputs, parsed)
        response = self._response_head(produced, parsed)
        response.raw_output_contents.extend([raw_bytes(v, dtype) for _, v, dtype in produced])
        return response

    def reply_bytes(self, outputs: Any, parsed: InferRequest) -> bytes:
        """``reply(outputs, parsed)`` serialised; for a request read through a kept plan,
        its kept head for these output shapes followed by the raw outputs."""
        head = None if parsed.plan is None else parsed.plan.one_output_head(outputs)
        if head is not None:  # the common reply: one output, its head kept
            return reply_bytes(head, [raw_bytes(outputs, self.oip.output_dtype("output"))])
        produced = self.oip.output_values(outputs, parsed)
        raws = [raw_bytes(values, dtype) for _, values, dtype in produced]
        if parsed.plan is None:
            return reply_bytes(self._response_head(produced, parsed).SerializeToString(), raws)
        shapes = tuple([(name, values.shape) for name, values, _ in produced])
        head = parsed.plan.replies.get(shapes)
        if head is None:
            head = self._response_head(produced, parsed).SerializeToString()
            parsed.plan.keep_reply(shapes, head)
        return reply_bytes(head, raws)

    def _response_head(self, produced: list[tuple[str, np.ndarray, str]],
                       parsed: InferRequest) -> Any:
        """The reply without its raw outputs."""
        pb = self.pb
        return pb.ModelInferResponse(
            model_name=self.oip.name, model_version=self.oip.version, id=parsed.id or "",
            outputs=[pb.ModelInferResponse.InferOutputTensor(
                name=name, datatype=OIP_DATATYPE[dtype], shape=list(values.shape))
                for name, values, dtype in produced])


def _typed_contents(tensor: Any, shape: list[int], dtype: str, where: str) -> Given:
    field = CONTENTS_FIELD.get(dtype)
    if field is None:
        raise MalformedRequestError(f"{where} ({tensor.name}): send {OIP_DATATYPE[dtype]} as "
                                    "raw_input_contents (the protocol has no typed field for it)")
    contents = getattr(tensor.contents, field)
    if len(contents) != math.prod(shape):
        raise MalformedRequestError(f"{where} ({tensor.name}): shape {shape} holds "
                                    f"{math.prod(shape)} values, {field} has {len(contents)}")
    values: np.ndarray = np.fromiter(contents, FIELD_DTYPE[field], len(contents))
    if DTYPES[dtype].kind == "int":
        check_int_range(values, tensor.name, dtype)
    values = values.astype(DTYPES[dtype].wire, copy=False)
    return Given(reshaped(values, shape, tensor.name, where), dtype)


def _fail(context: Any, code: Any, details: str) -> None:
    if context is not None:
        context.set_code(code)
        context.set_details(details)

