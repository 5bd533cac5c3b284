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
import shutil
import subprocess
import sys
import tempfile
import time

T0 = time.perf_counter()
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")
ROUTES = os.environ.get("ROUTES", "standalone,standalone_aot").split(",")
MODELS = {"qkan64": ("examples/qkan_mlp.py", {"width": [64, 64, 64]}, (1, 64), "float32"),
          "hqkan_gpt": ("examples/hqkan_gpt.py", {}, (1, 128), "int64"),
          "plain": ("examples/plain_mlp.py", {}, (4, 4), "float32")}
MODELS = {k: MODELS[k] for k in os.environ.get("MODELS", "qkan64,hqkan_gpt").split(",")}


def make(name):
    import importlib.util

    import torch
    path, config, shape, dtype = MODELS[name]
    spec = importlib.util.spec_from_file_location("probe_model_" + name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # what the serialised code imports by name
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    takes_device = "device" in module.build_model.__code__.co_varnames
    model = module.build_model(**config, **({"device": DEVICE} if takes_device else {}))
    model = model.eval().to(DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    if dtype == "int64":
        x = torch.randint(0, 256, shape, device=DEVICE, generator=g)
    else:
        x = torch.randn(shape, device=DEVICE, generator=g)
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
        elif route.startswith("standalone"):
            standalone_save(model, x, out, aot=route == "standalone_aot")
        else:
            ep = torch.export.export(model, (x,), strict=False)
            torch._inductor.aoti_compile_and_package(ep, package_path=out)
    print(json.dumps({"compile_s": time.perf_counter() - t, "bytes": os.path.getsize(out)}))


def standalone_save(model, x, out, aot):
    """dynamo's graph (fullgraph) -> inductor's standalone_compile, with a plan saying which
    graph input is the model input and which a parameter/buffer, and which graph output
    the model returns."""
    import torch
    from torch._inductor import standalone_compile
    graphs, returned = [], []

    def backend(gm, example):
        graphs.append((gm, list(example)))

        def run(*args):
            result = gm.forward(*args)
            returned.append(result)
            return result
        return run
    torch._dynamo.reset()
    out_value = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(x)
    (gm, example), = graphs
    state = {id(t): k for k, t in list(model.named_parameters(remove_duplicate=False))
             + list(model.named_buffers(remove_duplicate=False))}
    args = []
    for tensor in example:
        if tensor is x:
            args.append(["input", 0])
        elif id(tensor) in state:
            args.append(["state", state[id(tensor)]])
        else:
            raise RuntimeError(f"graph input neither the model input nor a parameter/buffer: "
                               f"{type(tensor)} {getattr(tensor, 'shape', None)}")
    output = next(i for i, t in enumerate(returned[0]) if t is out_value)
    artifact = standalone_compile(gm, example, dynamic_shapes="from_example_inputs", aot=aot)
    artifact.save(path=out, format="binary")
    with open(out + ".json", "w") as f:
        json.dump({"args": args, "output": output}, f)


def load(name, route, path):
    t_torch = time.perf_counter()
    import torch
    if DEVICE == "cuda":
        torch.cuda.init()
    t_model = time.perf_counter()
    model, x = make(name)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    t_load = time.perf_counter()
    profiler = None
    if os.environ.get("PROBE_PROFILE"):
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    if route == "aot":
        with open(path, "rb") as f:
            fn = torch.compiler.load_compiled_function(f, external_data={"model": model},
                                                       f_globals=sys.modules[type(model).__module__].__dict__)
    elif route.startswith("standalone"):
        t_import = time.perf_counter()
        from torch._inductor import CompiledArtifact
        t_imported = time.perf_counter()
        artifact = CompiledArtifact.load(path=path, format="binary")
        with open(path + ".json") as f:
            plan = json.load(f)
        state = dict(model.named_parameters(remove_duplicate=False))
        state.update(model.named_buffers(remove_duplicate=False))
        fixed = [None if kind == "input" else state[name] for kind, name in plan["args"]]

        def fn(t):
            return artifact(*[t if f is None else f for f in fixed])[plan["output"]]
        import_inductor_s = t_imported - t_import
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
    if profiler is not None:
        import pstats
        profiler.disable()
        with open(os.environ["PROBE_PROFILE"], "w") as f:
            stats = pstats.Stats(profiler, stream=f)
            stats.sort_stats("cumulative").print_stats(45)
            stats.sort_stats("tottime").print_stats(20)
    with torch.no_grad():
        ref = model(x).float().cpu()
    from torch._dynamo.utils import counters
    row = {"import_torch_s": t_model - t_torch, "model_s": t_load - t_model,
           "load_s": t_first - t_load, "first_call_s": t_done - t_first,
           "process_to_first_s": t_done - T0,
           "import_inductor_s": locals().get("import_inductor_s"),
           "dynamo_tracer_imported": "torch._dynamo.symbolic_convert" in sys.modules,
           "dynamo_frames_at_load": int(counters["stats"].get("unique_graphs", 0)),
           "max_abs_vs_eager": float((y - ref).abs().max()), "ref_scale": float(ref.abs().max())}
    if DEVICE != "cuda":
        print(json.dumps(row))
        return
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
        for route in ROUTES:
            path = os.path.join(outdir, f"{name}-{route}." + ("pt2" if route == "aoti" else "bin"))
            triton = os.path.join(outdir, f"{name}-{route}-triton")
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, TRITON_CACHE_DIR=triton, TORCHINDUCTOR_CACHE_DIR=tmp + "/i")
                try:
                    saved = child(["save", name, route, path], env, 240)
                except subprocess.TimeoutExpired:
                    saved = {"rc": "timeout"}
            print(name, route, "save", saved, flush=True)
            results[f"{name}/{route}/save"] = saved
            if saved.get("rc") != 0:
                continue
            for load_route in (("aoti", "aoti_loader") if route == "aoti" else (route,)):
                for run in range(4):
                    with tempfile.TemporaryDirectory() as tmp:
                        shipped = run > 0  # Triton's cache from the compile, as warm ships it
                        if shipped and os.path.isdir(triton):
                            shutil.copytree(triton, tmp + "/t")
                        env = dict(os.environ, TRITON_CACHE_DIR=tmp + "/t",
                                   TORCHINDUCTOR_CACHE_DIR=tmp + "/i")
                        if run == 3:
                            env["PROBE_PROFILE"] = os.path.join(outdir, f"{name}-{load_route}.prof.txt")
                        try:
                            loaded = child(["load", name, load_route, path], env, 120)
                        except subprocess.TimeoutExpired:
                            loaded = {"rc": "timeout"}
                    loaded["triton_cache_shipped"] = shipped
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
