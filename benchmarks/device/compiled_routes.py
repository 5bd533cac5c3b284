"""Issue 37 probe: which ahead-of-time compiled route loads without tracing on this host?

For QKAN [64,64,64] at 1x64 and the HQKAN GPT at 1x128 (flash solver), each route is
compiled in its own process, then loaded in fresh processes (empty Triton/inductor caches):
  aot   -- dynamo's aot_compile (fullgraph), serialised with the model as external data
  aoti  -- torch.export + AOTInductor package, loaded by aoti_load_package
Each load reports import/model/load/first-call seconds, dynamo frames traced at load, the
largest difference from eager, and the GPU time per call of a CUDA graph of the compiled
callable against one of the eager model (replays timed with CUDA events).

    python3 benchmarks/device/compiled_routes.py OUTDIR
"""
import json
import os
import subprocess
import sys
import tempfile
import time

T0 = time.perf_counter()
MODELS = {"qkan64": ("examples/qkan_mlp.py", {"width": [64, 64, 64]}, (1, 64), "float32"),
          "hqkan_gpt": ("examples/hqkan_gpt.py", {}, (1, 128), "int64")}


def make(name):
    import importlib.util

    import torch
    path, config, shape, dtype = MODELS[name]
    spec = importlib.util.spec_from_file_location("probe_model_" + name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # what the serialised code imports by name
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.build_model(device="cuda", **config).eval()
    g = torch.Generator(device="cuda").manual_seed(1)
    if dtype == "int64":
        x = torch.randint(0, 256, shape, device="cuda", generator=g)
    else:
        x = torch.randn(shape, device="cuda", generator=g)
    return model, x


def gpu_us(fn, x):
    import torch
    with torch.no_grad():
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(x)
        for _ in range(10):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = []
        for _ in range(5):
            start.record()
            for _ in range(200):
                graph.replay()
            end.record()
            end.synchronize()
            best.append(start.elapsed_time(end) * 1000 / 200)
    return sorted(best)[len(best) // 2]


def save(name, route, out):
    import torch
    model, x = make(name)
    t = time.perf_counter()
    with torch.no_grad():
        if route == "aot":
            compiled = torch.compile(model.forward, fullgraph=True).aot_compile(((x,), {}))
            data = type(compiled).serialize(compiled, external_data={"model": model}).serialized_data
            with open(out, "wb") as f:
                f.write(data)
        else:
            ep = torch.export.export(model, (x,), strict=False)
            torch._inductor.aoti_compile_and_package(ep, package_path=out)
    print(json.dumps({"compile_s": time.perf_counter() - t, "bytes": os.path.getsize(out)}))


def load(name, route, path):
    t_torch = time.perf_counter()
    import torch
    torch.cuda.init()
    t_model = time.perf_counter()
    model, x = make(name)
    torch.cuda.synchronize()
    t_load = time.perf_counter()
    if route == "aot":
        with open(path, "rb") as f:
            fn = torch.compiler.load_compiled_function(f, external_data={"model": model},
                                                       f_globals=sys.modules[type(model).__module__].__dict__)
    elif route == "aoti_loader":
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, 0)
        fn = lambda t: loader.run([t])[0]  # noqa: E731
    else:
        fn = torch._inductor.aoti_load_package(path)
    t_first = time.perf_counter()
    with torch.no_grad():
        y = fn(x)
        if isinstance(y, (list, tuple)):
            y = y[0]
        y = y.float().cpu()
    t_done = time.perf_counter()
    with torch.no_grad():
        ref = model(x).float().cpu()
    from torch._dynamo.utils import counters
    row = {"import_torch_s": t_model - t_torch, "model_s": t_load - t_model,
           "load_s": t_first - t_load, "first_call_s": t_done - t_first,
           "process_to_first_s": t_done - T0,
           "dynamo_frames_at_load": int(counters["stats"].get("unique_graphs", 0)),
           "max_abs_vs_eager": float((y - ref).abs().max()), "ref_scale": float(ref.abs().max())}
    try:
        def one(t):
            out = fn(t)
            return out[0] if isinstance(out, (list, tuple)) else out
        row["compiled_graph_gpu_us"] = gpu_us(one, x)
        row["eager_graph_gpu_us"] = gpu_us(model, x)
        row["ratio"] = row["compiled_graph_gpu_us"] / row["eager_graph_gpu_us"]
    except Exception as exc:
        row["capture_error"] = repr(exc)[:400]
    print(json.dumps(row))


def child(args, env, timeout):
    proc = subprocess.run([sys.executable, "-X", "faulthandler", __file__, *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    try:
        data = json.loads(last[0])
    except ValueError:
        data = {"rc": proc.returncode, "stderr_tail": proc.stderr[-1500:]}
    data["rc"] = proc.returncode
    return data


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    results = {}
    for name in MODELS:
        for route in ("aot", "aoti"):
            path = os.path.join(outdir, f"{name}-{route}." + ("bin" if route == "aot" else "pt2"))
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, TRITON_CACHE_DIR=tmp + "/t", TORCHINDUCTOR_CACHE_DIR=tmp + "/i")
                try:
                    saved = child(["save", name, route, path], env, 240)
                except subprocess.TimeoutExpired:
                    saved = {"rc": "timeout"}
            print(name, route, "save", saved, flush=True)
            results[f"{name}/{route}/save"] = saved
            if saved.get("rc") != 0:
                continue
            for load_route in ((route,) if route == "aot" else ("aoti", "aoti_loader")):
                for run in range(3):
                    with tempfile.TemporaryDirectory() as tmp:
                        env = dict(os.environ, TRITON_CACHE_DIR=tmp + "/t",
                                   TORCHINDUCTOR_CACHE_DIR=tmp + "/i")
                        try:
                            loaded = child(["load", name, load_route, path], env, 120)
                        except subprocess.TimeoutExpired:
                            loaded = {"rc": "timeout"}
                    print(name, load_route, "load", run, loaded, flush=True)
                    results[f"{name}/{load_route}/load{run}"] = loaded
    with open(os.path.join(outdir, "compiled_routes.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(*sys.argv[2:5])
    elif sys.argv[1] == "load":
        load(*sys.argv[2:5])
    else:
        main(sys.argv[1])
