#!/bin/bash
# fleet on a real GPU machine, as root, from the repository's root, writing what it saw under $OUT:
#  1. fleet's nvidia-smi probes run there and read by its parsers, idle and with a process holding 8 GiB
#     (smi_reads.py: captures-idle.tgz, captures-busy.tgz, the bytes kept for tests/fixtures);
#  2. `fleet reset` of the machine itself (connection: local) while gpu_holder.py holds GPU memory: with the kernel log
#     read (inventory.yaml) and without it (inventory-no-journal.yaml, for a machine with no journald): the holder
#     must be gone, the memory back, the JSON report in reset-*.json; then `fleet check` (check.json);
#  3. the run folders, in fleet-logs.tgz.
# Every holder it starts is ended by its pid. Needs PyTorch for the holder; fleet's dependencies importable
# (or their wheels in .whl, installed to /tmp/site). Run on a real H200 machine on 2026-12-04 (docs/operating.md).
set -u
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
FL="python3 -m fleet"
uname -r; nvidia-smi --version; command -v journalctl nv-fabricmanager
echo "### captures, idle"; python3 tools/gpucheck/smi_reads.py $OUT idle
H=""
holder() {
  python3 tools/gpucheck/gpu_holder.py 8 > /tmp/holder.out 2>&1 & H=$!
  for i in $(seq 120); do grep -q ready /tmp/holder.out && break; kill -0 $H 2>/dev/null || break; sleep 0.5; done
  echo "holder pid $H: $(cat /tmp/holder.out | tail -2)"
  nvidia-smi --query-compute-apps=pid,used_gpu_memory --format=csv,noheader
}
gone() { if kill -0 $H 2>/dev/null; then echo "holder $H STILL ALIVE"; kill -9 $H; else echo "holder $H gone"; fi; wait $H 2>/dev/null; echo "holder exit $?"; nvidia-smi --query-gpu=memory.used --format=csv,noheader; }
trap '[ -n "$H" ] && kill -9 $H 2>/dev/null' EXIT
holder
echo "### captures, busy"; python3 tools/gpucheck/smi_reads.py $OUT busy
for inv in inventory inventory-no-journal; do
  [ -n "$H" ] && ! kill -0 $H 2>/dev/null && holder
  echo "### fleet reset ($inv)"
  timeout 300 $FL reset h200 -i tools/gpucheck/$inv.yaml -y --json --log-dir /tmp/fl-logs > $OUT/reset-$inv.json 2> /tmp/err-$inv.txt
  echo "reset rc $?"; tail -30 /tmp/err-$inv.txt
  gone
done
echo "### fleet check"; timeout 120 $FL check h200 -i tools/gpucheck/inventory-no-journal.yaml --json --log-dir /tmp/fl-logs > $OUT/check.json 2> /tmp/err-check.txt
echo "check rc $?"; tail -15 /tmp/err-check.txt
tar czf $OUT/fleet-logs.tgz -C /tmp fl-logs
