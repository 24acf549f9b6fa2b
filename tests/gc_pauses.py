"""A DDP script, written as a user would (no trainguard import), one of whose
ranks (--gc-rank) makes a lot of cyclic garbage and collects it every
--gc-every steps: long garbage-collection pauses."""

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--gc-rank", type=int, default=1)
    p.add_argument("--gc-every", type=int, default=5)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == args.gc_rank and step % args.gc_every == 0:
            junk = []
            for i in range(300000):
                a, b = [], []
                a.append(b)
                b.append(a)
                junk.append(a)
            del junk
            gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
