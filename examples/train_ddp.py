"""A small real DDP training job (gloo, CPU) for trainguard.

An MLP learns a fixed random regression task. Every step's batch is derived
from (seed, step) alone, so a run that resumes from a checkpoint computes
exactly what an uninterrupted run computes: the final parameter checksum is
the same. Every --ckpt-every steps the job checkpoints model and optimizer
with trainguard's two-phase checkpointer (training continues while the
checkpoint is written; the ranks write the replicated state once in total),
and at start every rank resumes from the newest complete checkpoint.
`--ckpt-engine torch` uses plain torch.save/torch.load by rank 0 instead.

Run under trainguard:
    trainguard run --nnodes 2 --nproc-per-node 2 -- /usr/bin/python3 examples/train_ddp.py

Fault injection for tests (all off by default; all act on rank --crash-rank):
    --crash-at-step N    exits with code 1 at step N (first attempt only)
    --hang-at-step N     sleeps forever at step N (first attempt only)
    --raise-at-step N    raises a ValueError at step N (every attempt: a bug in the script)
    --nan-at-step N      its loss becomes NaN at step N (every attempt); the NaN guard raises
    --silent-nan-at-step N  its loss becomes NaN at step N and training goes on (no guard);
                         first attempt only (a device that computed wrong once), or with
                         --nan-every-attempt every attempt; --nan-ranks all: on every rank
    --xid-at-step N      its GPU fails (first attempt only): the driver reports Xid 79 to NVML (a
                         stand-in's: the file TG_FAKE_NVML_XID_DIR/TRAINGUARD_NODE_ID, where set)
                         and the rank dies with CUDA's "unspecified launch failure"
    --flip-at-step N     flips one bit of one parameter after step N's update, silently
                         (a device that computes wrong; first attempt only); with
                         --flip-on-node NODE instead: on whichever rank runs on that node
                         (TRAINGUARD_NODE_ID), every attempt (a device that always does)
"""

import argparse
import contextlib
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import trainguard
except ImportError:  # runs without trainguard too
    trainguard = None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=lambda v: v if v == "auto" else int(v), default=10,
                   help="steps between checkpoints, or auto: the controller's checkpoint plan "
                        "(trainguard.Checkpointer(save_every=\"auto\"))")
    p.add_argument("--ckpt-storage-every", type=int, default=0,
                   help="with --ckpt-every N: every Mth checkpoint goes to storage, the others to node memory alone")
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--ckpt-engine", choices=["trainguard", "torch"], default="trainguard")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--step-delay-first-attempt", action="store_true",
                   help="the step delay in the first attempt only (a restart runs at full speed)")
    p.add_argument("--out", default="", help="rank 0 writes the final checksum here")
    p.add_argument("--crash-at-step", type=int, default=-1)
    p.add_argument("--hang-at-step", type=int, default=-1)
    p.add_argument("--raise-at-step", type=int, default=-1)
    p.add_argument("--nan-at-step", type=int, default=-1)
    p.add_argument("--xid-at-step", type=int, default=-1)
    p.add_argument("--silent-nan-at-step", type=int, default=-1)
    p.add_argument("--nan-ranks", default="", help="'all' or a rank (default: --crash-rank)")
    p.add_argument("--nan-every-attempt", action="store_true")
    p.add_argument("--flip-at-step", type=int, default=-1)
    p.add_argument("--flip-on-node", default="")
    p.add_argument("--crash-rank", type=int, default=1)
    return p.parse_args()


def make_model(hidden):
    return nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, 8))


def batch_for(seed, step, rank, batch):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(batch, 64, generator=g)
    w = torch.Generator().manual_seed(seed)
    target_w = torch.randn(64, 8, generator=w)
    return x, torch.tanh(x @ target_w)


def checksum(model):
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def latest_checkpoint(ckpt_dir):
    if not os.path.isdir(ckpt_dir):
        return None
    steps = [int(f[5:-3]) for f in os.listdir(ckpt_dir) if f.startswith("step-") and f.endswith(".pt")]
    return os.path.join(ckpt_dir, "step-%d.pt" % max(steps)) if steps else None


def save_checkpoint(ckpt_dir, step, model, opt):
    os.makedirs(ckpt_dir, exist_ok=True)
    final = os.path.join(ckpt_dir, "step-%d.pt" % step)
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    # Keep the two newest.
    steps = sorted(int(f[5:-3]) for f in os.listdir(ckpt_dir) if f.startswith("step-") and f.endswith(".pt"))
    for old in steps[:-2]:
        os.remove(os.path.join(ckpt_dir, "step-%d.pt" % old))


def main():
    args = parse_args()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    if trainguard:
        trainguard.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = make_model(args.hidden)
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)

    start = 0
    ckpt = None
    if args.ckpt_storage_every and (args.ckpt_every == "auto" or not (args.ckpt_engine == "trainguard" and trainguard)):
        raise SystemExit("--ckpt-storage-every needs --ckpt-every N and trainguard's checkpointer")
    if args.ckpt_every == "auto" and not (args.ckpt_engine == "trainguard" and trainguard):
        raise SystemExit("--ckpt-every auto needs trainguard's checkpointer (--ckpt-engine trainguard)")
    if args.ckpt_engine == "trainguard" and trainguard:
        ckpt = trainguard.Checkpointer(args.ckpt_dir, keep_last=2, save_every=args.ckpt_every)
        restored = ckpt.load_latest()
        if restored:
            start, state = restored
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            print("rank %d: resumed from step %d (trainguard checkpoint, read from %s), restart %d"
                  % (rank, start, ckpt.last_source, restart), flush=True)
    else:
        path = latest_checkpoint(args.ckpt_dir)
        if path:
            state = torch.load(path)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"]
            if trainguard:
                trainguard.checkpoint_committed(start)
            print("rank %d: resumed from %s (step %d), restart %d" % (rank, path, start, restart),
                  flush=True)

    # DDP re-lays out its gradient buckets after the first backward pass, and
    # the bucket layout decides the summation order of the allreduce. One
    # throw-away backward here gives an uninterrupted and a resumed run the
    # same layout from their first real step on, hence bit-identical results.
    x, _ = batch_for(args.seed, 0, rank, args.batch)
    ddp(x).sum().backward()
    opt.zero_grad(set_to_none=True)

    ctx = trainguard.phase if trainguard else (lambda name: contextlib.nullcontext())
    for step in range(start + 1, args.steps + 1):
        if restart == 0 and rank == args.crash_rank and step == args.crash_at_step:
            print("rank %d: injected crash at step %d" % (rank, step), flush=True)
            sys.exit(1)
        if restart == 0 and rank == args.crash_rank and step == args.hang_at_step:
            print("rank %d: injected hang at step %d" % (rank, step), flush=True)
            while True:
                time.sleep(3600)
        if rank == args.crash_rank and step == args.raise_at_step:
            raise ValueError("injected bug: batch %d has no labels" % step)
        if restart == 0 and rank == args.crash_rank and step == args.xid_at_step:
            xids = os.environ.get("TG_FAKE_NVML_XID_DIR")
            if xids and os.environ.get("TRAINGUARD_NODE_ID"):
                with open(os.path.join(xids, os.environ["TRAINGUARD_NODE_ID"]), "a") as f:
                    f.write("%d 79\n" % int(os.environ.get("LOCAL_RANK", "0")))
            print("RuntimeError: CUDA error: unspecified launch failure", flush=True)
            os._exit(1)
        x, y = batch_for(args.seed, step, rank, args.batch)
        if rank == args.crash_rank and step == args.nan_at_step:
            x = x * float("nan")
        silent_nan = (step == args.silent_nan_at_step and (restart == 0 or args.nan_every_attempt)
                      and (args.nan_ranks == "all" or rank == int(args.nan_ranks or args.crash_rank)))
        if silent_nan:
            x = x * float("nan")
        with ctx("forward"):
            loss = nn.functional.mse_loss(ddp(x), y)
        if not torch.isfinite(loss) and args.silent_nan_at_step < 0:
            raise FloatingPointError("loss is %s at step %d" % (loss.item(), step))
        with ctx("backward"):
            opt.zero_grad()
            loss.backward()
        with ctx("optimizer"):
            opt.step()
        flip = (os.environ.get("TRAINGUARD_NODE_ID") == args.flip_on_node if args.flip_on_node
                else restart == 0 and rank == args.crash_rank)
        if flip and step == args.flip_at_step:
            with torch.no_grad():
                word = next(model.parameters()).view(-1)[:1].view(torch.int32)
                word.bitwise_xor_(1 << 22)
        if args.step_delay and (restart == 0 or not args.step_delay_first_attempt):
            time.sleep(args.step_delay)
        if trainguard:
            trainguard.step(step)
        if step % 10 == 0 or step == args.steps:
            print("rank %d: step %d loss %.6f" % (rank, step, loss.item()), flush=True)
        if ckpt.due(step) if ckpt else step % args.ckpt_every == 0:
            with ctx("checkpoint"):
                if ckpt:
                    # Returns once the state is in host memory; the commit is
                    # reported to trainguard when every rank's part is durable.
                    tier = None  # the one due() named
                    if args.ckpt_storage_every:  # every Mth save (by step) to storage, the others to memory alone
                        storage = (step // args.ckpt_every) % args.ckpt_storage_every == 0
                        tier = "storage" if storage else "memory"
                    ckpt.save(step, {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tier=tier)
                else:
                    t0 = time.perf_counter()
                    if rank == 0:
                        save_checkpoint(args.ckpt_dir, step, model, opt)
                    dist.barrier()
                    if trainguard:
                        trainguard.add_checkpoint_overhead(time.perf_counter() - t0)
                    if trainguard:
                        trainguard.checkpoint_committed(step)

    if ckpt:
        ckpt.wait()
    digest = checksum(model)
    if rank == 0:
        print("final checksum %s" % digest, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(digest + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
