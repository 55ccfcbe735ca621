"""A process holding GPU memory for tools/gpucheck/run.sh: N GiB allocated through PyTorch, "ready" printed once
it is, then asleep until killed (at most 15 minutes).

    python3 tools/gpucheck/gpu_holder.py N
"""

import sys
import time

import torch  # type: ignore[import-not-found]  # only on the GPU machine

held = torch.empty(int(sys.argv[1]) << 30, dtype=torch.uint8, device="cuda")
held.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(900)
