"""A DDP training script as users write it for torchrun: it does not import
trainguard. It saves its own checkpoint (torch.save, rank 0, atomically)
every --ckpt-every steps and resumes from it. For tests: --sleep-rank R
--sleep-at-step S makes rank R stop making progress inside the training loop
(in the first run of the job only); --die-when FILE makes --die-rank print
--die-line and die by SIGKILL once FILE exists (first run only; with
--die-again in any run, removing FILE as it dies, so that a test makes it
fail again by writing FILE again);
--raise-at-step S makes --die-rank raise the same ValueError at step S in
every run (a deterministic bug); --nan-at-step S makes --die-rank's loss NaN
at step S in the first run (no NaN guard: it trains on); --flip-at-step S
flips one bit of one of --die-rank's parameters after step S's update in
the first run (a device that computed wrong, silently); --out writes a
checksum of the final parameters. A --ckpt holding "{step}" keeps a file per
checkpoint and resumes from the newest. --data-dir D makes each step also
read 4 KiB of D/shard-RANK through a DataLoader (--loader-workers worker
processes), as a loader of file-backed data does, or, when D is an http://
URL, fetches those 4 KiB from D/shard-RANK with a Range request, as a
loader of object-store data does; the values read do not change the
training. --read-with preadv reads with os.preadv; --read-with direct opens
with O_DIRECT (the device itself, past the page cache)."""

import argparse
import glob
import hashlib
import mmap
import os
import re
import signal
import time
import urllib.request

import torch
import torch.distributed as dist
import torch.nn as nn


def batch(seed, step, rank, size=32):
    g = torch.Generator().manual_seed(seed * 100003 + step * 101 + rank)
    x = torch.randn(size, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


class Shard(torch.utils.data.Dataset):
    """Item i: 4 KiB of DIR/shard-RANK read at offset 4096 * i (wrapping)."""

    def __init__(self, directory, rank, start, stop, vectored=False, direct=False):
        self.path = (directory.rstrip("/") + "/shard-%d" % rank if directory.startswith("http://")
                     else os.path.join(directory, "shard-%d" % rank))
        self.start, self.stop = start, stop
        self.vectored = vectored  # os.preadv, as O_DIRECT readers do: the preadv2 system call
        self.direct = direct  # O_DIRECT, into a page-aligned buffer: past the page cache, to the device

    def __len__(self):
        return self.stop - self.start

    def __getitem__(self, i):
        if self.path.startswith("http://"):
            offset = 4096 * (self.start + i)
            request = urllib.request.Request(self.path, headers={"Range": "bytes=%d-%d" % (offset, offset + 4095)})
            with urllib.request.urlopen(request) as r:
                return torch.frombuffer(bytearray(r.read()), dtype=torch.uint8).sum()
        if self.direct:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            try:
                size = os.fstat(fd).st_size
                buf = mmap.mmap(-1, 4096)
                os.preadv(fd, [buf], (4096 * (self.start + i)) % max(size - 4096, 4096) // 4096 * 4096)
                return torch.frombuffer(bytearray(buf), dtype=torch.uint8).sum()
            finally:
                os.close(fd)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offset = (4096 * (self.start + i)) % max(size - 4096, 1)
            if self.vectored:
                buf = bytearray(4096)
                os.preadv(f.fileno(), [buf], offset)
                return torch.frombuffer(buf, dtype=torch.uint8).sum()
            f.seek(offset)
            return torch.frombuffer(bytearray(f.read(4096)), dtype=torch.uint8).sum()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--hidden", type=int, default=0, help="a hidden layer of this width (compute per step)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--sleep-rank", type=int, default=-1)
    p.add_argument("--sleep-at-step", type=int, default=-1)
    p.add_argument("--die-when", default="")
    p.add_argument("--die-rank", type=int, default=1)
    p.add_argument("--die-line", default="")
    p.add_argument("--die-again", action="store_true")
    p.add_argument("--raise-at-step", type=int, default=-1)
    p.add_argument("--nan-at-step", type=int, default=-1)
    p.add_argument("--flip-at-step", type=int, default=-1)
    p.add_argument("--data-dir", default="")
    p.add_argument("--loader-workers", type=int, default=0)
    p.add_argument("--read-with", choices=["read", "preadv", "direct"], default="read")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)) if not args.hidden else
        nn.Sequential(nn.Linear(16, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden), nn.Tanh(),
                      nn.Linear(args.hidden, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    latest = args.ckpt
    if "{step}" in args.ckpt:
        pattern = re.escape(args.ckpt).replace(re.escape("{step}"), r"(\d+)")
        found = [(int(re.fullmatch(pattern, f).group(1)), f) for f in glob.glob(args.ckpt.replace("{step}", "*"))
                 if re.fullmatch(pattern, f)]
        latest = max(found)[1] if found else ""
    if latest and os.path.exists(latest):
        state = torch.load(latest)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    # DDP lays its gradient buckets out anew after the first backward, and the
    # layout sets the allreduce's summation order: one throw-away backward
    # gives a resumed run the layout an uninterrupted one has (bit-identical).
    model(batch(7, 0, rank)[0]).sum().backward()
    opt.zero_grad()
    first_run = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    dataset = Shard(args.data_dir, rank, start, args.steps, args.read_with == "preadv",
                    args.read_with == "direct") if args.data_dir else None
    shards = iter(torch.utils.data.DataLoader(dataset, batch_size=None,
                                              num_workers=args.loader_workers)) if args.data_dir else None
    for step in range(start, args.steps):
        if shards is not None:
            next(shards)
        if first_run and rank == args.sleep_rank and step == args.sleep_at_step:
            while True:
                time.sleep(1)
        if ((first_run or args.die_again) and rank == args.die_rank and args.die_when
                and os.path.exists(args.die_when)):
            if args.die_again:
                os.unlink(args.die_when)
            print(args.die_line, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == args.die_rank and step == args.raise_at_step:
            raise ValueError("Expected input batch_size (4) to match target batch_size (1).")
        x, y = batch(7, step, rank, args.batch)
        if first_run and rank == args.die_rank and step == args.nan_at_step:
            x = x * float("nan")
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if first_run and rank == args.die_rank and step == args.flip_at_step:
            with torch.no_grad():
                next(model.parameters()).view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 22)
        if args.step_delay:
            time.sleep(args.step_delay)
        if rank == 0 and (step + 1) % args.ckpt_every == 0:
            path = args.ckpt.replace("{step}", str(step))
            tmp = path + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)
        dist.barrier() if (step + 1) % args.ckpt_every == 0 else None
    if rank == 0:
        h = hashlib.sha256()
        for t in model.state_dict().values():
            h.update(t.numpy().tobytes())
        with open(args.out, "w") as f:
            f.write(h.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
