"""A DDP training script written the way users write them (no trainguard in
it) for the GPU acceptance check of issue 25: two gloo ranks share one GPU
with CUDA tensors; in the first attempt, rank --stuck-rank queues minutes of
GPU work (torch.cuda._sleep) ahead of its step's collectives at step
--stall-at, so its device never reaches the bucket all-reduce while its peer
waits inside it. A restarted attempt trains to the end.

    trainguard run --nproc-per-node 2 -- bench/gpu_device_hang.py
With --cpu the stall is a host sleep instead (to try the harness without a GPU).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=80)
parser.add_argument("--stall-at", type=int, default=20)
parser.add_argument("--stuck-rank", type=int, default=1)
parser.add_argument("--cpu", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
device = torch.device("cpu" if args.cpu else "cuda:0")
if not args.cpu:
    torch.cuda.set_device(0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).to(device)
model = DistributedDataParallel(model, device_ids=None if args.cpu else [0])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
for step in range(args.steps):
    if attempt == 0 and rank == args.stuck_rank and step == args.stall_at:
        print("rank %d: queueing a long kernel ahead of step %d" % (rank, step), flush=True)
        if args.cpu:
            time.sleep(600)
        else:
            for _ in range(400):
                torch.cuda._sleep(1_000_000_000)
    x = torch.randn(64, 512, device=device)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print("rank %d step %d loss %.4f" % (rank, step, loss.item()), flush=True)
    time.sleep(0.05)
dist.destroy_process_group()
print("rank %d done" % rank, flush=True)
