"""A user's script (no trainguard import): gloo all-reduces, and in the first
attempt rank 1 prints a GPU complaint no rule knows and exits 1."""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
for step in range(20):
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1 and attempt == 0 and step == 5:
        print("error: gpu device lost, fallen state detected by driver", flush=True)
        sys.exit(1)
dist.destroy_process_group()
