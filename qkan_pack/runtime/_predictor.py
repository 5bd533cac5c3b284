"""``Predictor``: load a verified artifact, pre-capture every shape, serve replay-only calls."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import PredictorClosedError
from ..format import Manifest
from ._calls import CallMemory, call_signature, plan_call
from ._inputs import InputMatcher
from ._kernels import PrecompiledExport
from ._load import Loaded, load
from ._options import LoadOptions
from ._runners import EagerRunner, GraphRunner

if TYPE_CHECKING:
    from ._capture import ShapeGraph



#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["Predictor"]

#: ``pad_batch`` pads without proof; ``build --pad`` proves padding and makes it the default.
PAD_BATCH_DEPRECATED = (
    "pad_batch=True zero-pads smaller batches without proof that the model's rows are "
    "independent, and is deprecated: rebuild with --pad x=0 (build(..., pad={'x': 0})), which "
    "proves padding on the model at build; every call of such an artifact pads as declared")

class Predictor:
    """Replay-only inference over the shapes an artifact declares.

    Build with ``Predictor.load``. Calls accept exactly the manifest's shapes and dtypes
    (dense torch tensors on the CPU or the predictor's device, or numpy arrays); anything
    else raises ``InputError`` listing what is accepted. Documented results, not errors:
    non-contiguous inputs are copied; ``requires_grad`` inputs are read without autograd
    (outputs never require grad); NaN/inf values are computed as given (checking them would
    cost a device sync per call); numpy inputs give numpy outputs (a bfloat16 one as a host
    tensor: numpy has no bfloat16).

    A call whose signature (each value's kind, shape, dtype, device, layout and grad flag;
    keyword names) passed before takes the remembered way: one lookup, copy in, replay, copy
    out (``_calls``). Calls are thread-safe; one replays at a time.
    """

    def __init__(self, loaded: Loaded, options: LoadOptions) -> None:
        manifest = loaded.artifact.manifest
        self.manifest: Manifest = manifest
        self.digest = loaded.artifact.digest
        #: Who signed the artifact, when it was loaded with trusted keys (else None).
        self.signed_by = loaded.artifact.signed_by
        self.path = loaded.artifact.path
        self.device = loaded.device
        self.report = loaded.report
        self.options = options
        self.pad_batch = options.pad_batch
        self.copy_outputs = options.copy_outputs
        self._model = loaded.model
        self._classes = loaded.classes
        self._runner: EagerRunner | GraphRunner | None = loaded.runner
        self._source_lines = loaded.artifact.source_lines  # the model's lines, until close
        self._lock = threading.Lock()
        self._inputs = InputMatcher(manifest, self.device, options.pad_batch)
        self._calls = CallMemory()  # changed under self._lock only

    # -- construction ------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "auto", *,
             options: LoadOptions | None = None, export: PrecompiledExport | None = None,
             **keywords: Any) -> Predictor:
        """Verify, rebuild, load weights, capture every shape (CUDA), self-test, return.

        ``device`` is ``"auto"`` (CUDA where there is a GPU, else the CPU: the report's
        ``device`` says which), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. Options are a
        ``LoadOptions`` or its fields as keywords (``expected_digest``, ``config_overrides``,
        ``pad_batch``, ``copy_outputs``, ``reference_tolerance``, ``replay_tolerance``,
        ``kernels``, ``compiled``, ``progress``, ``trusted_keys``, ``precision``,
        ``layout``); see ``LoadOptions`` for what each does. ``export`` is ``qkan-pack warm``'s: where a
        compiled-mode load writes the precompiled graphs it makes (``PrecompiledExport``).
        """
        if options is None:
            options = LoadOptions.from_keywords(keywords)
        elif keywords:
            raise TypeError("pass either options=LoadOptions(...) or keywords, not both")
        predictor = cls(load(path, device, options, export), options)
        if options.pad_batch and predictor.manifest.padding is None:
            warnings.warn(PAD_BATCH_DEPRECATED, DeprecationWarning, stacklevel=2)
        return predictor

    # -- calls -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = call_signature(args, kwargs)
        plan = self._calls.get(key)
        if plan is None:
            return self._first_call(key, args, kwargs)
        inputs = args if plan.prepare is None else plan.prepare(args, kwargs)
        with self._lock:
            if self._runner is None:  # closed while this call waited
                raise PredictorClosedError(path=str(self.path))
            leaves = plan.replay(inputs)
        return leaves[0] if plan.finish is None else plan.finish(leaves)

    def _open_runner(self) -> EagerRunner | GraphRunner:
        """The runner, read under the lock: a call racing ``close()`` either finishes before
        it (close waits for the lock) or finds the predictor closed, never a freed runner."""
        runner = self._runner
        if runner is None:
            raise PredictorClosedError(path=str(self.path))
        return runner

    def _first_call(self, key: tuple[Any, ...] | None, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        """The general path, for a signature not seen (or not remembered, ``key`` None):
        every check, refusals that list what is accepted; a call that passes leaves the
        plan later calls of its signature follow."""
        self._open_runner()  # a closed predictor says so before judging the inputs
        tensors, as_numpy, index, fit = self._inputs.match(args, kwargs)
        copy = self.copy_outputs or as_numpy  # numpy outputs are host copies in any case
        out_device = tensors[0].device if tensors[0].device != self.device else None
        if as_numpy:
            out_device = torch.device("cpu")
        with self._lock:
            replay = self._open_runner().replayer(index, fit, copy, out_device if copy else None)
            plan = plan_call(args, kwargs, self.manifest.input_names, replay, as_numpy,
                             self.manifest.shapes[index].outputs, self._classes)
            self._calls.remember(key, plan)
            leaves = plan.replay(tensors)
        return leaves[0] if plan.finish is None else plan.finish(leaves)

    def accepted(self) -> str:
        """The shapes and dtypes this artifact accepts, as one line (``InputError.accepted``
        holds the same as data)."""
        return self._inputs.accepted()

    def whole_graph(self, index: int) -> ShapeGraph | None:
        """The CUDA graph of the whole model that calls at manifest shape ``index`` replay, or
        None (submodule graphs, eager, CPU). For benchmarks that time a bare replay of the
        predictor's own graph against its call; replaying it bypasses every input check."""
        runner = self._open_runner()
        return runner.whole_graph(index) if isinstance(runner, GraphRunner) else None

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Free captured graphs and their memory pool, after any call in flight has finished;
        later calls (and calls that were waiting) raise ``PredictorClosedError``. The model
        source's lines leave ``linecache`` when no other predictor of them is open."""
        with self._lock:
            if self._runner is not None:
                self._runner.close()
            self._runner = None
            self._calls.clear()  # plans hold the graphs' buffers
            self._model = None  # type: ignore[assignment]
            self._source_lines.release()

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._runner is None else "ready"
        return f"Predictor({str(self.path)!r}, device={self.device}, {state}, {self.accepted()})"


