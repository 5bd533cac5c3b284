"""Why a fresh `compiled="shipped"` load of the HQKAN GPT compiles qkan's `_pz_encoding_kernel`
although `warm --compiled` shipped a kernel set (GPU suite at 1571b4c): build and warm the
test's artifact, then load it in a fresh process as the test does, keeping every Triton cache
entry of that kernel the load writes; the shipped entries of the same kernel are copied
beside them, so their metadata (specialisation, constants, options) can be compared.
Run by benchmarks/device/compiled-missing-kernel.sh. Files: $OUT/r/pz/{shipped,fresh}/..."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from qkan_pack import build
from qkan_pack.builder import warm
from qkan_pack.runtime import read_artifact

KERNEL = "_pz_encoding_kernel"
OUT = Path(os.environ["OUT"]) / "r" / "pz"

FRESH = """
import shutil, sys
from pathlib import Path
import qkan_pack.runtime._kernels as kernels
from qkan_pack import Predictor
out, kernel, calls, original = Path(sys.argv[2]), sys.argv[3], [], kernels._group_stamps
def stamps(root):
    found = original(root)
    calls.append(1)
    if len(calls) == 2:  # on leaving the load: keep what it wrote of the kernel
        for path in root.glob(f"*/*{kernel}*"):
            if path.suffix != ".cubin":
                target = out / f"{path.parent.name}__{path.name}"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)
    return found
kernels._group_stamps = stamps
# who compiles the kernel in this process, with which specialisation (inductor compiles in
# this process: TORCHINDUCTOR_COMPILE_THREADS=1 in the environment)
import traceback
import triton
import triton.compiler.compiler as triton_compiler
original_compile = triton_compiler.compile
def compile_seen(src, *args, **kwargs):
    name = getattr(getattr(src, "fn", None), "__name__", "") or str(getattr(src, "name", ""))
    if kernel in name or kernel in str(getattr(src, "src", ""))[:5000]:
        print("COMPILE", name, "signature", getattr(src, "signature", None))
        print("  constexprs", getattr(src, "constexprs", getattr(src, "constants", None)))
        print("  attrs", getattr(src, "attrs", None))
        print("  options", {k: v for k, v in (kwargs.get("options") or {}).items()
                            if k in ("debug", "sanitize_overflow", "num_warps")})
        frames = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}"
                  for f in traceback.extract_stack()[:-1]
                  if "qkan" in f.filename or "_inductor" in f.filename or "<string>" in f.filename]
        print("  stack", " <- ".join(reversed(frames[-14:])))
    return original_compile(src, *args, **kwargs)
triton_compiler.compile = compile_seen
triton.compile = compile_seen
# the autotuning choices in the load's private inductor directory as it closes: the shipped
# ones restored there, and any the load wrote itself (a name the shipped set lacks)
import os
import qkan_pack.runtime._compiled as compiled_mode
clears, clear = [], compiled_mode._clear_inductor_caches
def listing():
    clears.append(1)
    root = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/nonexistent"))
    if len(clears) == 2 and root.is_dir():
        for path in sorted(root.rglob("*.best_config")):
            print("best_config at close:", path.relative_to(root).as_posix(), path.stat().st_size)
    clear()
compiled_mode._clear_inductor_caches = listing
predictor = Predictor.load(sys.argv[1], device="cuda", compiled="shipped")
print(predictor.report.compiled)
print(predictor.report.kernel_cache)
print(predictor.report.warnings)
"""


def main() -> None:
    path = build("examples/hqkan_gpt.py", "1x32,4x32", output=Path(tempfile.mkdtemp()) / "gpt",
                 dtype="int64", config={"block_size": 32, "n_embd": 64, "hidden": 32},
                 progress=False).path
    result = warm(path, "cuda", compiled=True)
    print("warm:", result.compiled, result.files, "files")
    artifact = read_artifact(path)
    for name in sorted(artifact.files):
        if name.endswith(".best_config"):
            print("shipped best_config:", name)
    for name, data in artifact.files.items():
        if KERNEL in name and not name.endswith(".cubin"):
            target = OUT / "shipped" / name.replace("/", "__")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    scratch = Path(tempfile.mkdtemp())
    env = {**os.environ, "TRITON_CACHE_DIR": str(scratch / "t"),
           "TORCHINDUCTOR_CACHE_DIR": str(scratch / "i"), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", FRESH, str(path), str(OUT / "fresh"), KERNEL],
                          env=env, capture_output=True, text=True, check=False)
    print(done.stdout, done.stderr[-3000:])
    for side in ("shipped", "fresh"):
        for meta in sorted((OUT / side).glob(f"*{KERNEL}.json")) if (OUT / side).is_dir() else []:
            record = json.loads(meta.read_text())
            keep = {k: record.get(k) for k in ("hash", "constants", "num_warps", "num_stages",
                                               "num_ctas", "debug", "sanitize_overflow",
                                               "enable_fp_fusion", "launch_cooperative_grid")}
            print(side, meta.name, json.dumps(keep, default=str)[:1500])
        # the specialisation (which arguments are 16-divisible or 1) is in the TTIR signature
        for ttir in sorted((OUT / side).glob(f"*{KERNEL}.ttir")) if (OUT / side).is_dir() else []:
            line = next((ln for ln in ttir.read_text().splitlines() if "tt.func" in ln), "")
            print(side, ttir.name[:12], re.sub(r'loc\([^)]*\)|\(#loc\)', "", line.strip())[-1500:])


if __name__ == "__main__":
    main()
