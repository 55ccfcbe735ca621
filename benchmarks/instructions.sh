#!/usr/bin/env bash
# fleet's own instructions a host, exact where CPU time is noise: controller.py's replay (its recording made once,
# over SSH) run under valgrind's cachegrind at two sizes; the difference over the hosts between them is the marginal
# user-space cost of a host (the kernel's part, creating files and writing lines, is not counted). About 3 minutes.
#
#   benchmarks/instructions.sh [SMALL] [LARGE]      (default 100 300; needs valgrind: apt-get install valgrind)
#
# Its temp folder (the recording, the runs' logs) is removed however it ends.
set -euo pipefail
small=${1:-100}
large=${2:-300}
python=${PYTHON:-.venv/bin/python}
work=$(mktemp -d -t fleet-instructions-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$python" - "$work" <<'PY'
import pickle, sys
from pathlib import Path
import anyio
sys.path.insert(0, "benchmarks")
import controller
work = Path(sys.argv[1])
(work / "recording.pickle").write_bytes(pickle.dumps(anyio.run(controller.record, work)))
PY
count() {
    mkdir -p "$work/size-$1"
    FLEET_LOG_DIR="$work/size-$1" valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        "$python" benchmarks/controller.py --one "$1" --recording "$work/recording.pickle" --tmp "$work/size-$1" \
        2>&1 >/dev/null | awk '/I *refs/ {gsub(",", "", $NF); print $NF}'
}
a=$(count "$small")
b=$(count "$large")
"$python" -c "import sys; a, b, s, l = map(int, sys.argv[1:]); print(f'{(b - a) / (l - s) / 1e6:.3f} M instructions a host (marginal, {s} -> {l} hosts)')" "$a" "$b" "$small" "$large"
