#!/bin/bash
# Issue 44 item 3, after aoti-crash-frames.sh showed the AOTInductor wrapper library crashing
# in std::regex inside itself (parse_device_str) and linking no libstdc++.so: is libstdc++
# linked statically because the compiler finds no libstdc++.so to link against, and does
# the package load once the compiler is pointed at the shared library? About 3 minutes.
# Files: $OUT/r/aoti-libstdcxx.txt
RESULTS="${OUT:?run this through the device tool, which sets OUT}/r"
mkdir -p "$RESULTS"
HERE=benchmarks/device
{
    echo "== what g++ links"
    g++ -print-file-name=libstdc++.so; ls -la "$(g++ -print-file-name=libstdc++.so)" 2>&1
    g++ -print-file-name=libstdc++.a
    ls -la /usr/lib/x86_64-linux-gnu/libstdc++* 2>&1
    dpkg -l 2>/dev/null | grep -i "libstdc++\|g++" | awk '{print $2, $3}'
    echo "== a plain shared library with std::regex"
    printf '#include <regex>\nextern "C" int f(){ std::regex r("[a-z]+:([0-9]+)"); return std::regex_match("cuda:0", r); }\n' > /tmp/r.cpp
    g++ -shared -fPIC -O2 /tmp/r.cpp -o /tmp/libr.so && readelf -d /tmp/libr.so | grep NEEDED
    python3 -c "import torch, ctypes; print('regex library in a torch process:', ctypes.CDLL('/tmp/libr.so').f())"; echo "exit $?"
    echo "== the package, compiled against the shared libstdc++"
    mkdir -p /tmp/stdcxx && ln -sf /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /tmp/stdcxx/libstdc++.so
    printf '#!/bin/bash\nexec g++ "$@" -L/tmp/stdcxx\n' > /tmp/gxx && chmod +x /tmp/gxx
    CXX=/tmp/gxx timeout 150 python3 $HERE/aoti_crash.py make /tmp/aoti-shared --no-precompile-headers 2>&1 | tail -n 2
    python3 - <<'PY'
import subprocess, zipfile
with zipfile.ZipFile("/tmp/aoti-shared/model.pt2") as archive:
    so = next(n for n in archive.namelist() if n.endswith(".so"))
    archive.extract(so, "/tmp/aoti-shared-x")
print(subprocess.run(f"readelf -d /tmp/aoti-shared-x/{so} | grep NEEDED", shell=True,
                     capture_output=True, text=True).stdout)
PY
    for how in single official; do
        timeout 60 python3 -X faulthandler $HERE/aoti_crash.py load /tmp/aoti-shared $how 2>&1 | grep -v "Extract file" | tail -n 4
        echo "== load $how: exit ${PIPESTATUS[0]}"
    done
} > "$RESULTS/aoti-libstdcxx.txt" 2>&1
cat "$RESULTS/aoti-libstdcxx.txt"
