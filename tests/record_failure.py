"""A training script as users write them for torchrun: main() decorated with
torch's @record, no trainguard import. Rank FAIL_RANK raises deep in its data
loading at step FAIL_STEP; an exit handler then prints NOISE lines, as logging
and tracking libraries do at shutdown, so the traceback is no longer among the
rank's last lines of output (stdout and stderr together). With LINGER_S, the
failing rank then closes its connections and lingers that long before it
exits, as a rank whose teardown outlasts its sockets: its peers fail and
exit first."""

import atexit
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

FAIL_RANK = int(os.environ.get("FAIL_RANK", "1"))
FAIL_STEP = int(os.environ.get("FAIL_STEP", "3"))
NOISE = int(os.environ.get("NOISE", "40"))
LINGER_S = float(os.environ.get("LINGER_S", "0"))


def read_shard_header(rank, step):
    if rank == FAIL_RANK and step == FAIL_STEP:
        raise ValueError("shard %d of step %d has a corrupt header (magic 0x0000)" % (rank, step))
    return step


def load_shard(rank, step):
    return read_shard_header(rank, step)


def say_goodbye():
    # On stderr, after the traceback in the same pipe: nothing can reorder them.
    for i in range(NOISE):
        print("tracker: uploading run summary part %d/%d" % (i + 1, NOISE), file=sys.stderr, flush=True)
    if LINGER_S > 0 and dist.is_initialized() and dist.get_rank() == FAIL_RANK:
        dist.destroy_process_group()
        time.sleep(LINGER_S)


@record
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    atexit.register(say_goodbye)
    print("rank %d of %d starting" % (rank, dist.get_world_size()), flush=True)
    print("rank %d: a warning on stderr" % rank, file=sys.stderr, flush=True)
    x = torch.ones(4)
    for step in range(1, 1000):
        load_shard(rank, step)
        dist.all_reduce(x)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
