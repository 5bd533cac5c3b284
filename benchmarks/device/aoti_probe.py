"""Issue 44 item 3 probe: can AOTInductor serve compiled mode without inductor's Python?

``make MODEL OUT``: trace the model's whole forward on cuda (the precompiled route's
``trace_graph``), export that graph and compile it with AOTInductor (timed), and also make the
current form (``standalone_compile``) for comparison. ``load OUT``: in a fresh process, load the
package with torch's C++ loader only, run it, compare with eager, capture it in a CUDA graph
and replay; say which modules the load imported."""

from __future__ import annotations

import dataclasses
import json
import runpy
import sys
import time

import torch

MODELS = {"q64": ("examples/qkan_mlp.py", {"width": [64, 64, 64]}, (1, 64), torch.float32),
          "gpt": ("examples/hqkan_gpt.py", {}, (1, 128), torch.int64)}


def _model(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    source, config, shape, dtype = MODELS[name]
    model = runpy.run_path(source)["build_model"](device="cuda", **config).eval()
    x = (torch.randint(0, 256, shape, dtype=dtype) if dtype == torch.int64
         else torch.randn(shape)).cuda()
    return model, x


def make(name: str, out: str) -> None:
    from qkan_pack.runtime._precompiled import compile_aoti, compile_inductor, trace_graph

    model, x = _model(name)
    gm, example, plan = trace_graph(model, model, [x])
    t = time.perf_counter()
    data = compile_inductor(gm, example)
    standalone = time.perf_counter() - t
    t = time.perf_counter()
    package = compile_aoti(gm, example)  # torch.export of the traced graph + AOTInductor
    aoti = time.perf_counter() - t
    path = f"{out}/{name}.pt2"
    with open(path, "wb") as handle:
        handle.write(package)
    with open(f"{out}/{name}.bin", "wb") as handle:
        handle.write(data)
    torch.save({"x": x.cpu(), "args": [dataclasses.asdict(r) for r in plan.args],
                "outputs": list(plan.outputs)}, f"{out}/{name}.pt")
    import os
    print(json.dumps({"model": name, "standalone_s": round(standalone, 2),
                      "aoti_s": round(aoti, 2),
                      "pt2_bytes": os.path.getsize(path), "bin_bytes": len(data)}))


def _args(name: str, saved: dict) -> tuple[torch.Tensor, torch.nn.Module, list[torch.Tensor]]:
    from qkan_pack.runtime._precompiled import TensorRef, resolve

    model, _ = _model(name)
    x = saved["x"].cuda()
    refs = [TensorRef(kind=r["kind"], name=r["name"], shape=tuple(r["shape"]), dtype=r["dtype"])
            for r in saved["args"]]
    return x, model, [x if ref.kind == "input" else resolve(model, ref) for ref in refs]


def loadbin(name: str, out: str) -> None:
    """The current form's fresh-process load, for comparison."""
    before = set(sys.modules)
    t = time.perf_counter()
    from qkan_pack.runtime._precompiled import _callable

    with open(f"{out}/{name}.bin", "rb") as handle:
        graph = _callable(handle.read())
    loaded = time.perf_counter() - t
    _, _, args = _args(name, torch.load(f"{out}/{name}.pt"))
    t = time.perf_counter()
    with torch.no_grad():
        graph(*args)
    torch.cuda.synchronize()
    print(json.dumps({"model": name, "form": "standalone_compile", "load_s": round(loaded, 3),
                      "first_call_s": round(time.perf_counter() - t, 3),
                      "new_modules": len(set(sys.modules) - before)}))


def load(name: str, out: str) -> None:
    before = set(sys.modules)
    t = time.perf_counter()
    loader = torch._C._aoti.AOTIModelPackageLoader(f"{out}/{name}.pt2", "model", True, 1, -1)
    loaded = time.perf_counter() - t
    imported = sorted(set(sys.modules) - before)
    saved = torch.load(f"{out}/{name}.pt")
    x, model, args = _args(name, saved)
    t = time.perf_counter()
    with torch.no_grad():
        got = loader.boxed_run(list(args))
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        want = model(x)
        want = want if isinstance(want, torch.Tensor) else want[0]
        leaf = got[saved["outputs"][0]]
        error = float((leaf.float() - want.float()).abs().max())
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            loader.boxed_run(list(args))
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            captured = loader.boxed_run(list(args))
        graph.replay()
        torch.cuda.synchronize()
        replay_error = float((captured[saved["outputs"][0]].float() - want.float()).abs().max())
        t = time.perf_counter()
        for _ in range(200):
            graph.replay()
        torch.cuda.synchronize()
        replay_us = (time.perf_counter() - t) / 200 * 1e6
    print(json.dumps({"model": name, "form": "aoti", "load_s": round(loaded, 4),
                      "first_call_s": round(first, 4),
                      "max_abs_error": error, "replay_error": replay_error,
                      "replay_us": round(replay_us, 1), "load_imported": imported,
                      "dynamo": "torch._dynamo" in sys.modules,
                      "inductor": "torch._inductor" in sys.modules}))


if __name__ == "__main__":
    {"make": make, "load": load, "loadbin": loadbin}[sys.argv[1]](sys.argv[2], sys.argv[3])
