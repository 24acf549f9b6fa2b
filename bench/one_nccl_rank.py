"""One NCCL rank on GPU 0 under trainguard's automatic instrumentation, for
the GPU benches (nccl_journal_check.py, journal_event_cost.py): a status
page of its own, torchrun's environment, the process group initialised.
Needs the module built with CUDA on sys.path (TRAINGUARD_PY, default
/tmp/tgpy)."""
import os
import sys


def start(port):
    """Returns (trainguard._core, the status page's path)."""
    sys.path.insert(0, os.environ.get("TRAINGUARD_PY", "/tmp/tgpy"))
    from trainguard import _core

    page = "/dev/shm/tg-bench-page-%d" % os.getpid()
    _core._create_status_page(page)
    os.environ.update(TRAINGUARD_STATUS_PAGE=page, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    from trainguard import _autoinstrument

    _autoinstrument.install()
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    return _core, page
