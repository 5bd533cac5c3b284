# Sourced first by every script here, on the device machine (the repository root is the
# working directory): installs what that machine lacks under /tmp/site and builds the serving
# benchmarks' artifact. Needs the carried folders prepared on the developer's machine
# (README.md beside this file): .whl (qkan, orjson) and, for serving, .raypkg (Ray Serve).
set -o pipefail
SITE=/tmp/site
if [ -d .raypkg ]; then
    bash .raypkg/install.sh "$SITE" > /dev/null || { echo "setup: Ray Serve did not install"; exit 1; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl \
    || { echo "setup: the carried wheels (.whl) did not install"; exit 1; }
export PYTHONPATH="$SITE:$PWD" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1 QKAN_PACK_REQUIRE_GPU=1
RESULTS="${OUT:?run these through the device tool, which sets OUT}/r"
mkdir -p "$RESULTS"
# The commit under test, for file names: the copy sent to the device has no .git, so the
# command names it (COMMIT=873470c bash benchmarks/device/gpu-tests.sh).
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# The artifact the serving figures use (issue 19): examples/qkan_mlp.py, rows of 2 features,
# in /tmp/mlp at 1x2,8x2,32x2; or in DIR at SHAPES (build_serving_artifact DIR SHAPES).
build_serving_artifact() {
    local dir=${1:-/tmp/mlp} shapes=${2:-1x2,8x2,32x2}
    local log="$RESULTS/build${1:+-$(basename "$dir")}.txt"
    [ -d "$dir" ] || python3 -m qkan_pack build examples/qkan_mlp.py --shapes "$shapes" \
        -o "$dir" > "$log" 2>&1 || { cat "$log"; exit 1; }
}
