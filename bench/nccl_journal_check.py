"""Checks the journal of communication operations on a GPU with NCCL (one
rank): DDP with the journaling comm hook trains exactly like plain DDP,
buckets and collectives are journaled, an all_reduce queued behind a long GPU
kernel stays in flight until the GPU ran it; and the issue cost of a
journaled NCCL all_reduce against a direct one. Needs the trainguard module
built with CUDA on sys.path (TRAINGUARD_PY, default /tmp/tgpy).

    python3 bench/nccl_journal_check.py
"""
import os, time
from one_nccl_rank import start
_core, page = start(29533)
import torch, torch.distributed as dist
print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 1024, device="cuda")
ref = torch.nn.Linear(1024, 1024).cuda(); ref.load_state_dict(model.module.state_dict())
ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad(); model(x).square().mean().backward(); opt.step()
    ropt.zero_grad(); ref(x).square().mean().backward(); ropt.step()
torch.cuda.synchronize()
print("DDP with the journaling hook equals plain training:", torch.equal(model.module.weight, ref.weight))
time.sleep(0.3)
d = _core._read_status_page(page)
buckets = [o for o in d["ops"] if o["op"] == "all_reduce"]
print("step", d["step"], "step_count", d["step_count"], "bucket all_reduces", len(buckets),
      "dtype", buckets[-1]["dtype"], "numel", buckets[-1]["numel"], "in flight", sum(o["in_flight"] for o in d["ops"]))
t = torch.ones(1 << 20, device="cuda")
torch.cuda._sleep(2_000_000_000)   # ~1 s of GPU time queued ahead of the collective
dist.all_reduce(t)
d = _core._read_status_page(page)
last = d["ops"][-1]
print("right after all_reduce returned:", last["op"], "#%d" % last["seq"], "in flight:", last["in_flight"])
torch.cuda.synchronize()
deadline = time.time() + 5
while time.time() < deadline and _core._read_status_page(page)["ops"][-1]["in_flight"]:
    time.sleep(0.02)
print("after the GPU ran it:", "in flight:", _core._read_status_page(page)["ops"][-1]["in_flight"])
w = dist.all_reduce(t, async_op=True); w.wait(); torch.cuda.synchronize(); time.sleep(0.2)
print("async op completed:", not _core._read_status_page(page)["ops"][-1]["in_flight"])
import timeit
n = 2000
t1 = torch.ones(1, device="cuda")
from trainguard import _comm_journal
raw = _comm_journal._plain["all_reduce"]
for fn in (raw, dist.all_reduce): fn(t1)
a = min(timeit.repeat(lambda: raw(t1), number=n, repeat=5)) / n
b = min(timeit.repeat(lambda: dist.all_reduce(t1), number=n, repeat=5)) / n
torch.cuda.synchronize()
print("NCCL all_reduce of 1 element, issue cost: direct %.2f us, journaled %.2f us (+%.2f us)" % (a*1e6, b*1e6, (b-a)*1e6))
dist.destroy_process_group()
os.unlink(page)
