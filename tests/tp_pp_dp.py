"""A model-parallel training script in the style of Megatron, as a torchrun
script: it does not import trainguard. 8 ranks = 2 tensor-parallel x
2 data-parallel x 2 pipeline stages (rank = tp + 2 * dp + 4 * pp, so
tensor-parallel groups are neighbours, data-parallel groups have stride 2,
pipeline groups stride 4), every group made with new_group.

Each step: stage 0 computes a tensor-parallel layer (all_reduce over its TP
group) and sends the activation to stage 1 (send/recv in its pipeline
group); stage 1 computes its layer and the loss, sends the activation's
gradient back; each rank averages its gradients over its data-parallel group
(all_reduce), steps its optimizer, and the loss is averaged over the world.

--replicated-dp seeds each rank's weights by its TP/PP coordinate, as
Megatron does, so data-parallel peers hold identical weights (replicas);
without it every rank's weights are its own.

--order tpd numbers ranks tp + 2 * pp + 4 * dp instead (pipeline neighbours
have stride 2, data-parallel peers stride 4), and --pipeline-on-world sends
the activations with plain send/recv on the world group, with no pipeline
new_group, as many hand-written pipelines do.

Faults, for tests, in generation (restart) number G only:
  --stop RANK:WHERE:G   the rank stops making progress at --fault-step, at
                        WHERE: "before-tp" (before its TP all_reduce),
                        "before-send" (stage 0, before sending forward),
                        "before-dp" (before its DP all_reduce), or
                        "sigstop" (stops its own process before its DP all_reduce)
  --desync RANK:G       at --fault-step the rank issues a broadcast where its
                        peers issue the world all_reduce of the loss
"""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

TP, DP, PP = 2, 2, 2


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fault-step", type=int, default=4)
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--desync", action="append", default=[])
    p.add_argument("--step-delay", type=float, default=0.05)
    p.add_argument("--replicated-dp", action="store_true")
    p.add_argument("--order", choices=("tdp", "tpd"), default="tdp")
    p.add_argument("--pipeline-on-world", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == TP * DP * PP, "needs %d ranks" % (TP * DP * PP)
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def rank_of(t, d, s):
        return t + TP * d + TP * DP * s if args.order == "tdp" else t + TP * s + TP * PP * d

    tp_rank = rank % TP
    dp_rank = [d for d in range(DP) for s in range(PP) if rank_of(tp_rank, d, s) == rank][0]
    stage = [s for s in range(PP) if rank_of(tp_rank, dp_rank, s) == rank][0]

    # Every rank creates every group, in the same order.
    tp_group = dp_group = pp_group = None
    for s in range(PP):
        for d in range(DP):
            g = dist.new_group([rank_of(t, d, s) for t in range(TP)])
            if (s, d) == (stage, dp_rank):
                tp_group = g
    for s in range(PP):
        for t in range(TP):
            g = dist.new_group([rank_of(t, d, s) for d in range(DP)])
            if (s, t) == (stage, tp_rank):
                dp_group = g
    if not args.pipeline_on_world:
        for d in range(DP):
            for t in range(TP):
                members = [rank_of(t, d, s) for s in range(PP)]
                g = dist.new_group(members)
                if rank in members:
                    pp_group = g
    peer = rank_of(tp_rank, dp_rank, 1 - stage)

    stop_at = {}
    for spec in args.stop:
        r, where, g = spec.split(":")
        if int(r) == rank and int(g) == generation:
            stop_at[where] = True
    desync = any(int(s.split(":")[0]) == rank and int(s.split(":")[1]) == generation
                 for s in args.desync)

    def maybe_stop(where, step):
        if step != args.fault_step:
            return
        if where == "before-dp" and stop_at.get("sigstop"):
            os.kill(os.getpid(), signal.SIGSTOP)
        if stop_at.get(where):
            while True:
                time.sleep(1)

    torch.manual_seed(100 + (tp_rank + TP * stage if args.replicated_dp else rank))
    weight = torch.randn(16, 16, requires_grad=True)
    opt = torch.optim.SGD([weight], lr=0.01)
    for step in range(args.steps):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step * 10 + dp_rank))
        opt.zero_grad()
        if stage == 0:
            h = x @ weight
            maybe_stop("before-tp", step)
            partial = h.detach().clone()
            dist.all_reduce(partial, group=tp_group)
            maybe_stop("before-send", step)
            dist.send(partial, peer, group=pp_group)
            grad = torch.empty_like(partial)
            dist.recv(grad, peer, group=pp_group)
            h.backward(grad)
            loss = torch.zeros(1)
        else:
            received = torch.empty(4, 16)
            dist.recv(received, peer, group=pp_group)
            received.requires_grad_(True)
            maybe_stop("before-tp", step)
            out = received @ weight
            total = out.detach().clone()
            dist.all_reduce(total, group=tp_group)
            loss = (out * total).mean()
            loss.backward()
            dist.send(received.grad, peer, group=pp_group)
            loss = loss.detach().reshape(1)
        maybe_stop("before-dp", step)
        dist.all_reduce(weight.grad, group=dp_group)
        weight.grad /= DP
        opt.step()
        if desync and step == args.fault_step:
            dist.broadcast(loss, src=0)
        else:
            dist.all_reduce(loss)
        time.sleep(args.step_delay)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
