"""One rank of a checkpoint test job (tests/test_checkpoint.py launches
several with the torchrun environment). Prints one JSON line at the end."""

import argparse
import glob
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import trainguard


def state_for(step, numel):
    return {"model": {"w": torch.arange(numel, dtype=torch.float32) + step,
                      "b": torch.full((3, 5), float(step), dtype=torch.float64)},
            "opt": [torch.tensor(step), {"lr": 0.1, "note": "step %d" % step}],
            "empty": torch.zeros(0, dtype=torch.int8),
            "step": step}


def matches(state, step, numel):
    want = state_for(step, numel)
    return (torch.equal(state["model"]["w"], want["model"]["w"])
            and torch.equal(state["model"]["b"], want["model"]["b"])
            and int(state["opt"][0]) == step and state["opt"][1] == want["opt"][1]
            and state["empty"].numel() == 0 and state["step"] == step)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--mode", choices=["save", "load"], required=True)
    p.add_argument("--steps", default="10,20")
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--kill-at-step", type=int, default=-1, help="SIGKILL self right after this save")
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--die-before-step", type=int, default=-1,
                   help="--kill-rank SIGKILLs itself before saving this step")
    p.add_argument("--offset", type=int, default=0,
                   help="added to the state's values: attempts of a job differ")
    p.add_argument("--rank0-first-at", type=int, default=-1,
                   help="at this step the other ranks save only once rank 0's part is durable")
    p.add_argument("--replicated", type=int, default=1)
    p.add_argument("--shard-groups", type=int, default=0,
                   help="N > 0: ranks r and r+N... hold the same state (N distinct shards)")
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--commit-timeout", type=float, default=30)
    p.add_argument("--memory-root", default="",
                   help="node memory copies in MEMORY_ROOT/node<N>, N = rank // --ranks-per-node; a step "
                        "written as 20m in --steps goes to node memory alone")
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--no-memory-rank", type=int, default=-1, help="this rank's node keeps no memory copies")
    p.add_argument("--block-memory-step", type=int, default=-1,
                   help="--kill-rank cannot write this step into its node's memory")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.memory_root and rank != args.no_memory_rank:
        node_memory = os.path.join(args.memory_root, "node%d" % (rank // args.ranks_per_node))
        os.makedirs(node_memory, exist_ok=True)
        os.environ["TRAINGUARD_MEMORY_CHECKPOINTS"] = node_memory
        if rank == args.kill_rank and args.block_memory_step >= 0:
            with open(os.path.join(node_memory, "step-%012d" % args.block_memory_step), "w") as f:
                f.write("not a directory")
    replicated, group, shard = bool(args.replicated), None, 0
    if args.shard_groups:
        world = dist.get_world_size()
        groups = [list(range(s, world, args.shard_groups)) for s in range(args.shard_groups)]
        pgs = [dist.new_group(g) for g in groups]  # every rank creates every group
        shard = rank % args.shard_groups
        replicated, group = groups[shard], pgs[shard]
    ck = trainguard.Checkpointer(args.dir, keep_last=args.keep_last, replicated=replicated,
                                 process_group=group, commit_timeout=args.commit_timeout)
    offset = 1000 * shard + args.offset  # each shard group holds different state
    out = {"rank": rank}
    if args.mode == "save":
        results = []
        for entry in args.steps.split(","):
            step, tier = int(entry.rstrip("m")), "memory" if entry.endswith("m") else "storage"
            if step == args.die_before_step and rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == args.rank0_first_at and rank != 0:
                pattern = os.path.join(args.dir, "step-%012d" % step, "save-*", "rank-00000.json")
                deadline = time.monotonic() + 60
                while not glob.glob(pattern) and time.monotonic() < deadline:
                    time.sleep(0.01)
                # Rank 0's manifest of this save is durable; its poll finds the others' old ones.
                time.sleep(0.2)
            ck.save(step, state_for(step + offset, args.numel), tier=tier)
            if step == args.kill_at_step and rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)  # during phase 2
            # Training goes on while phase 2 runs; a failed save does not stop it.
            results.append({"step": step, "ok": ck.wait(), "error": ck.last_error})
            dist.barrier()
        out["saves"] = results
        out["stats"] = ck.stats()
    else:
        r = ck.load_latest()
        out["step"] = r[0] if r else None
        out["matches"] = bool(r) and matches(r[1], r[0] + offset, args.numel)
        out["matches_offsets"] = [o for o in range(0, 2001, 500)
                                  if bool(r) and matches(r[1], r[0] + 1000 * shard + o, args.numel)]
        out["bytes_read"] = ck.bytes_read
        out["source"] = ck.last_source
    dist.barrier()
    print(json.dumps(out), flush=True)
    # Tear down as a well-behaved script does: the engine's thread and gloo's
    # before the interpreter's finalization (torch 1.13's gloo threads have
    # been seen to abort a process that exits with its group still alive).
    ck.close()
    del ck
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
