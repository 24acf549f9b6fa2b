"""An import-heavy DDP training script, written the way users write them: it
imports torch and a few heavy libraries (SciPy, pandas, scikit-learn,
SymPy), uses each for a small part of its work, checkpoints with torch.save
and resumes with torch.load. It knows nothing of trainguard.

Every batch comes from (seed, step), so a run resumed from a checkpoint ends
with the same parameters as one that never stopped; rank 0 prints them as a
checksum (and writes it to --out).

    python3 heavy_train.py --steps 200 --ckpt-dir ckpt [--step-delay 0.02]
"""
import argparse
import hashlib
import os
import time

import numpy as np
import pandas as pd
import scipy.signal
import scipy.special
import sklearn.preprocessing
import sympy
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def learning_rate_schedule(steps):
    """A cosine schedule written symbolically once, then evaluated."""
    t = sympy.Symbol("t")
    expr = sympy.Rational(1, 2) * (1 + sympy.cos(sympy.pi * t / steps))
    f = sympy.lambdify(t, expr, "numpy")
    return 1e-3 * np.asarray(f(np.arange(steps + 1)), dtype=np.float64)


def features(seed, step, rank, batch):
    rng = np.random.default_rng(seed * 1_000_003 + step * 1009 + rank)
    raw = pd.DataFrame(rng.normal(size=(batch, 32)))
    smooth = scipy.signal.lfilter([0.5, 0.5], [1.0], raw.to_numpy(), axis=0)
    x = sklearn.preprocessing.StandardScaler().fit_transform(smooth)
    y = scipy.special.expit(x[:, :4] - x[:, 4:8])
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)


def checksum(model):
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--out", default="")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(7)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 4))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    lrs = learning_rate_schedule(args.steps)
    start = 0
    path = os.path.join(args.ckpt_dir, "latest.pt")
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    # One throw-away backward: DDP's bucket order is then the same for a
    # resumed and an uninterrupted run (see examples/train_ddp.py).
    x, _ = features(7, 0, rank, 16)
    ddp(x).sum().backward()
    opt.zero_grad(set_to_none=True)

    for step in range(start + 1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = float(lrs[step])
        x, y = features(7, step, rank, 16)
        loss = nn.functional.mse_loss(torch.sigmoid(ddp(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.step_delay:
            time.sleep(args.step_delay)
        if step % args.ckpt_every == 0:
            if rank == 0:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                tmp = path + ".tmp"
                torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
                os.replace(tmp, path)
            dist.barrier()
    if rank == 0:
        total = checksum(model)
        print("final checksum", total, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(total + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
