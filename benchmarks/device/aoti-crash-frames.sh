#!/bin/bash
# Issue 44 item 3, diagnosis after aoti-crash.sh: where inside the AOTInductor package's
# container constructor the load crashes (the innermost frames, which aoti-crash.sh's tail
# cut off), what the extracted wrapper library links against, and whether a CPU package of
# the same model loads on the same host and torch (a crash only on CUDA points at the CUDA
# path of the generated code, not at the toolchain). About 4 minutes.
# Files: $OUT/r/aoti-crash-frames.txt
RESULTS="${OUT:?run this through the device tool, which sets OUT}/r"
mkdir -p "$RESULTS"
HERE=benchmarks/device
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    g++ --version | head -n 1
    timeout 150 python3 $HERE/aoti_crash.py make /tmp/aoti-cuda --no-precompile-headers 2>&1 | tail -n 3
    echo "== innermost frames (cuda, single)"
    timeout 120 cuda-gdb -q -batch -ex run -ex "bt 24" --args \
        python3 $HERE/aoti_crash.py load /tmp/aoti-cuda single 2>&1 \
        | grep -v "Extract file\|^\[New Thread\|^\[Thread\|^\[Detaching" | grep -v "^0x.*/python3.12/" | tail -n 60
    echo "== wrapper library"
    python3 - <<'PY'
import pathlib, subprocess, zipfile
with zipfile.ZipFile("/tmp/aoti-cuda/model.pt2") as archive:
    names = archive.namelist()
    print("\n".join(names))
    so = next(n for n in names if n.endswith(".so"))
    archive.extract(so, "/tmp/aoti-x")
path = pathlib.Path("/tmp/aoti-x") / so
print(subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout)
print(subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout[:3000])
PY
    echo "== cpu package on this host"
    AOTI_DEVICE=cpu timeout 150 python3 $HERE/aoti_crash.py make /tmp/aoti-cpu --no-precompile-headers 2>&1 | tail -n 3
    AOTI_DEVICE=cpu timeout 60 python3 -X faulthandler $HERE/aoti_crash.py load /tmp/aoti-cpu single 2>&1 | grep -v "Extract file" | tail -n 8
    echo "== cpu: exit ${PIPESTATUS[0]}"
} > "$RESULTS/aoti-crash-frames.txt" 2>&1
cat "$RESULTS/aoti-crash-frames.txt"
