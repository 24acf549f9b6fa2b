"""Starts the ranks of the Python kill trials (tests/test_checkpoint_kill.py).

Importing PyTorch takes a second per process on this machine; this process
imports it once and forks fresh ranks from itself for each launch, so a trial
costs what the training job does, not the imports. A forked rank starts with
no process group and no checkpoint engine, exactly like a restarted one.

Commands, one JSON object per line on stdin; one JSON line answers each:
  {"cmd": "launch", "attempt": K, "world": W, "port": P, "dir": D, "keep_last": N,
   "numel": E, "saves": S, "restart_from": "latest"|"previous", "log": PREFIX}
        -> {"pids": [...]}; rank r writes JSON lines to PREFIX-r.jsonl and its
           output to PREFIX-r.log
  {"cmd": "reap"}  -> {"status": [...]} once every rank of the last launch exited
"""

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

import trainguard


def state_of(attempt, step, numel):
    """What attempt `attempt` saves at `step`: different for every attempt and step."""
    g = torch.Generator().manual_seed(attempt * 1_000_003 + step)
    return {"model": {"w": torch.randn(numel, generator=g),
                      "b": torch.randint(-1000, 1000, (17, 3), generator=g, dtype=torch.int64)},
            "opt": [torch.randn(numel // 4, generator=g).to(torch.bfloat16), {"lr": 0.1}],
            "meta": {"attempt": attempt, "step": step}}


def same_state(got, want):
    return (torch.equal(got["model"]["w"], want["model"]["w"])
            and torch.equal(got["model"]["b"], want["model"]["b"])
            and torch.equal(got["opt"][0], want["opt"][0]) and got["opt"][1] == want["opt"][1]
            and got["meta"] == want["meta"])


def run_rank(rank, a):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(a["world"]), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a["port"]))
    out = open("%s-%d.jsonl" % (a["log"], rank), "a", buffering=1)
    # The launch's own rendezvous file: no port that a rank killed in the
    # launch before, or another test, may still hold.
    dist.init_process_group("gloo", init_method="file://%s.rendezvous" % a["log"], rank=rank,
                            world_size=a["world"])
    ck = trainguard.Checkpointer(a["dir"], keep_last=a["keep_last"], commit_timeout=5)
    steps = ck.steps()
    restored = None
    if a["restart_from"] == "previous" and len(steps) > 1:
        restored = (steps[1], ck.load(steps[1]))
    else:
        restored = ck.load_latest()
    loaded = {"event": "loaded", "rank": rank, "step": None, "attempt": None, "whole": None}
    if restored is not None:
        step, state = restored
        meta = state.get("meta", {})
        loaded.update(step=step, attempt=meta.get("attempt"),
                      whole=meta.get("step") == step
                      and same_state(state, state_of(meta.get("attempt", -1), step, a["numel"])))
    out.write(json.dumps(loaded) + "\n")
    first = (restored[0] if restored else 0) + 10
    for i in range(a["saves"]):
        step = first + 10 * i
        ck.save(step, state_of(a["attempt"], step, a["numel"]))
        if i % 2 == 1:
            ck.wait()
        out.write(json.dumps({"event": "saved", "step": step}) + "\n")
    ck.wait()
    out.write(json.dumps({"event": "done"}) + "\n")
    dist.destroy_process_group()


def main():
    children = []
    for line in sys.stdin:
        a = json.loads(line)
        if a["cmd"] == "launch":
            children = []
            for rank in range(a["world"]):
                pid = os.fork()
                if pid == 0:
                    code = 0
                    try:
                        log = os.open("%s-%d.log" % (a["log"], rank),
                                      os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                        os.dup2(log, 1)
                        os.dup2(log, 2)
                        run_rank(rank, a)
                    except BaseException:
                        traceback.print_exc()
                        code = 1
                    finally:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(code)
                children.append(pid)
            print(json.dumps({"pids": children}), flush=True)
        elif a["cmd"] == "reap":
            status = [os.waitpid(pid, 0)[1] for pid in children]
            print(json.dumps({"status": status}), flush=True)
        elif a["cmd"] == "exit":
            return


if __name__ == "__main__":
    main()
