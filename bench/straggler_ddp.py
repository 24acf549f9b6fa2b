"""A plain DDP training script, as users write it for torchrun (it does not
import trainguard), for issue 43's straggler acceptance runs
(bench/straggler_acceptance.py): an MLP on gloo, steps of some tens of
milliseconds. With --slow F, rank --slow-rank computes F times as much from
step --slow-from on: inside the model's forward it spins for (F - 1) times
that forward's own CPU time, and inside its backward for (F - 1) times the
previous step's backward CPU time, so its forward and backward both become
F times its peers'."""

import argparse
import os
import time

import torch
import torch.distributed as dist


def spin(seconds, busy):
    until = time.process_time() + seconds
    while time.process_time() < until:
        busy @ busy


class Spin(torch.autograd.Function):
    """The identity, spinning for `forward_s` on the way in and `backward_s`
    on the way back: extra compute inside the model's forward and backward."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s, busy):
        spin(forward_s, busy)
        ctx.backward_s, ctx.busy = backward_s, busy
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        spin(ctx.backward_s, ctx.busy)
        return grad, None, None, None


class Net(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(512, hidden), torch.nn.ReLU(),
                                          torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                          torch.nn.Linear(hidden, 512))
        self.extra = 0.0  # compute added, as a share of the model's own
        self.last_backward = 0.0
        self.busy = torch.randn(128, 128)

    def forward(self, x):
        c0 = time.process_time()
        y = self.layers(x)
        if self.extra > 0:
            y = Spin.apply(y, (time.process_time() - c0) * self.extra, self.last_backward * self.extra, self.busy)
        return y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=220)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--slow", type=float, default=1.0)
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--slow-from", type=int, default=120)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net(args.hidden)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.001)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        if args.slow > 1 and rank == args.slow_rank and step >= args.slow_from:
            model.extra = args.slow - 1
        x = torch.randn(args.batch, 512, generator=gen)
        loss = ddp(x).pow(2).mean()
        b0 = time.process_time()
        loss.backward()
        model.last_backward = time.process_time() - b0
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 50 == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
