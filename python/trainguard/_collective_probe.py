"""The collective probes of a diagnosis round, run by a node's agent with the
job's Python (torch.distributed on gloo; the same calls run on NCCL when a
GPU is there):

- an all-to-all among LOCAL_RANKS processes of this node, forked from this
  one, rendezvous through a FileStore in the agent's run directory: bus
  bandwidth (nccl-tests' definition, algbw x (n-1)/n) and a check that every
  chunk arrived with what its sender put in it (a wrong chunk names the
  sender);
- an all-reduce with the other nodes of the rack (this process is rank
  RACK_RANK of RACK_SIZE, rendezvous at the rack's first node): bus bandwidth
  (algbw x 2(n-1)/n) and a check of the sum;
- with --gpu, per visible CUDA device: a half-precision GEMM (TFLOP/s) and
  pinned host<->device copies (GB/s), timed with CUDA events; and a
  known-answer check for silent data corruption (docs/sdc.md): GEMMs of
  small fixed-seed integers in float32 and float16, whose every result is
  exact in any summation order, compared bit for bit with the CPU's integer
  product (mismatched elements: must be 0).

With --nccl and a GPU, the collectives run on NCCL (local rank r on device
r), as the job's ranks would; else on gloo.

Prints one JSON object on stdout: {"figures": [{"name", "value", "error"?}]}
or {"skipped": why} when torch cannot be used here. Every wait is bounded by
--timeout; the agent kills the probe after that anyway.
"""

import argparse
import json
import os
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--local-ranks", type=int, default=1)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--bytes", type=int, default=4 << 20)
    p.add_argument("--iters", type=int, default=10)  # timed runs; the fastest counts
    p.add_argument("--rack-rank", type=int, default=-1)
    p.add_argument("--rack-size", type=int, default=0)
    p.add_argument("--rack-master", default="")
    p.add_argument("--timeout", type=float, default=30)
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--nccl", action="store_true", help="collectives on NCCL when a GPU is there")
    return p.parse_args(argv)


def figure(name, value=0.0, error="", device=""):
    out = {"name": name, "value": float(value)}
    if error:
        out["error"] = error
    if device:
        out["device"] = device  # the GPU's model: floors are per model, and only alike GPUs are compared
    return out


def timed(run, iters):
    """The fastest of `iters` runs after a warm-up: what the links and the
    node can do. A neighbour's burst slows some runs, not the best one;
    a slow link or a throttled node slows every run."""
    run()  # warm-up: connections, buffers
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def backend_and_device(nccl, index):
    """NCCL on a GPU when asked and there (the ranks' own library), else gloo on the CPU."""
    import torch
    import torch.distributed as dist

    if nccl and torch.cuda.is_available() and dist.is_nccl_available():
        device = torch.device("cuda", index % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return "nccl", device, torch.cuda.synchronize
    return "gloo", torch.device("cpu"), lambda: None


def all_to_all_rank(rank, n, store_path, nbytes, iters, timeout, nccl, result_fd):
    import datetime

    import torch
    import torch.distributed as dist

    backend, device, sync = backend_and_device(nccl, rank)
    dist.init_process_group(backend, store=dist.FileStore(store_path, n), rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=timeout))
    chunk = max(nbytes // 4 // n, 1)
    # Chunk d of rank r holds r * 1000 + d everywhere: receivers know what each sender sent.
    send = torch.cat([torch.full((chunk,), float(rank * 1000 + d)) for d in range(n)]).to(device)
    recv = torch.empty_like(send)

    def once():
        dist.all_to_all_single(recv, send)
        sync()

    seconds = timed(once, iters)
    got = recv.cpu()
    wrong = [s for s in range(n) if not torch.equal(got[s * chunk:(s + 1) * chunk],
                                                   torch.full((chunk,), float(s * 1000 + rank)))]
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 or wrong:
        os.write(result_fd, (json.dumps({"rank": rank, "seconds": seconds, "bytes": send.numel() * 4,
                                         "wrong": wrong, "backend": backend}) + "\n").encode())


def die_with_parent(parent):
    """A forked rank dies with the probe (which dies with its agent): never an orphan."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def all_to_all(args):
    n = args.local_ranks
    store_path = os.path.join(args.work_dir, "alltoall-%d.store" % os.getpid())
    if os.path.exists(store_path):
        os.unlink(store_path)
    read_fd, write_fd = os.pipe()
    children = []
    for rank in range(n):
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                die_with_parent(parent)
                os.close(read_fd)
                all_to_all_rank(rank, n, store_path, args.bytes, args.iters, args.timeout, args.nccl, write_fd)
            except BaseException as e:  # noqa: B902 - the child must exit, whatever happened
                os.write(write_fd, (json.dumps({"rank": rank, "error": "%s: %s" % (type(e).__name__, e)})
                                    + "\n").encode())
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    os.close(write_fd)
    deadline = time.monotonic() + args.timeout + 10
    for pid in children:
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.02)
    with os.fdopen(read_fd) as f:
        reports = [json.loads(line) for line in f if line.strip()]
    if os.path.exists(store_path):
        os.unlink(store_path)
    errors = ["local rank %d: %s" % (r["rank"], r["error"]) for r in reports if "error" in r]
    wrong = sorted({(r["rank"], s) for r in reports for s in r.get("wrong", [])})
    if wrong:
        return figure("alltoall_gbps", error="all-to-all delivered wrong data: " + ", ".join(
            "local rank %d from local rank %d" % (r, s) for r, s in wrong))
    first = [r for r in reports if r.get("rank") == 0 and "seconds" in r]
    if errors or not first:
        return figure("alltoall_gbps", error="; ".join(errors) or "the all-to-all did not finish within %g s"
                      % args.timeout)
    algbw = first[0]["bytes"] / first[0]["seconds"] / 1e9
    return figure("alltoall_gbps", algbw * (n - 1) / n)


def rack_all_reduce(args):
    import datetime

    import torch
    import torch.distributed as dist

    n = args.rack_size
    backend, device, sync = backend_and_device(args.nccl, 0)
    try:
        dist.init_process_group(backend, init_method="tcp://" + args.rack_master, rank=args.rack_rank,
                                world_size=n, timeout=datetime.timedelta(seconds=args.timeout))
    except Exception as e:  # noqa: B902 - a failed rendezvous is the finding
        return figure("rack_allreduce_gbps", error="rendezvous at %s: %s" % (args.rack_master, e))
    try:
        count = max(args.bytes // 4, 1)
        data = torch.full((count,), float(args.rack_rank + 1), device=device)
        expected = float(n * (n + 1) // 2)

        def once():
            data.fill_(float(args.rack_rank + 1))
            dist.all_reduce(data)
            sync()

        seconds = timed(once, args.iters)
        if not torch.all(data.cpu() == expected):
            return figure("rack_allreduce_gbps", error="the all-reduce's sum is wrong (%g, not %g)"
                          % (float(data[0]), expected))
        algbw = count * 4 / seconds / 1e9
        return figure("rack_allreduce_gbps", algbw * 2 * (n - 1) / n)
    except Exception as e:  # noqa: B902
        return figure("rack_allreduce_gbps", error="%s: %s" % (type(e).__name__, e))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: B902
            pass


def known_answer_mismatches(torch, device):
    """Elements of fixed-seed GEMMs computed wrong on `device`: inputs are
    integers in [-3, 3], so every product and partial sum is an exactly
    representable integer (float32: n=512, sums up to 4,608 < 2^24; float16
    with its reduced-precision accumulation: n=64, sums up to 576 < 2^11),
    whatever order the device sums in; the truth is the CPU's int64 product."""
    wrong = 0
    gemms = [(512, torch.float32)]
    if torch.device(device).type == "cuda":
        gemms.append((64, torch.float16))  # tensor cores; the CPU has no half GEMM in torch 1.13
    for n, dtype in gemms:
        g = torch.Generator().manual_seed(24 + n)
        a = torch.randint(-3, 4, (n, n), generator=g)
        b = torch.randint(-3, 4, (n, n), generator=g)
        want = a @ b
        got = (a.to(device=device, dtype=dtype) @ b.to(device=device, dtype=dtype)).float().cpu().to(torch.int64)
        wrong += int((got != want).sum())
    return wrong


def gpu_figures(args):
    import torch

    if not torch.cuda.is_available():
        return [figure("collective_probe", error="the job's PyTorch sees no CUDA device although the driver "
                       "lists GPUs: no GPU compute or copy figures")]
    out = []
    size = 8192 if args.bytes >= (64 << 20) else 4096
    copy_bytes = max(args.bytes * 16, 64 << 20)
    for i in range(torch.cuda.device_count()):
        model = ""
        try:
            model = torch.cuda.get_device_name(i)
            with torch.cuda.device(i):
                a = torch.randn(size, size, device="cuda", dtype=torch.float16)
                b = torch.randn(size, size, device="cuda", dtype=torch.float16)
                host = torch.empty(copy_bytes, dtype=torch.uint8, pin_memory=True)
                dev = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")

                def best(op):
                    op()  # warm-up
                    torch.cuda.synchronize()
                    fastest = float("inf")
                    for _ in range(args.iters):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        op()
                        end.record()
                        end.synchronize()
                        fastest = min(fastest, start.elapsed_time(end) / 1000)
                    return fastest

                out.append(figure("gpu_gemm_tflops:%d" % i, 2 * size ** 3 / best(lambda: torch.mm(a, b)) / 1e12,
                                  device=model))
                out.append(figure("gpu_known_answer_mismatches:%d" % i,
                                  known_answer_mismatches(torch, torch.device("cuda", i)), device=model))
                out.append(figure("gpu_h2d_gbps:%d" % i,
                                  copy_bytes / best(lambda: dev.copy_(host, non_blocking=True)) / 1e9, device=model))
                out.append(figure("gpu_d2h_gbps:%d" % i,
                                  copy_bytes / best(lambda: host.copy_(dev, non_blocking=True)) / 1e9, device=model))
        except Exception as e:  # noqa: B902 - a GPU that fails here is the finding
            out.append(figure("gpu_gemm_tflops:%d" % i, error="%s: %s" % (type(e).__name__, e), device=model))
    return out


def main(argv):
    args = parse_args(argv)
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("torch.distributed without gloo")
    except Exception as e:  # noqa: B902
        print(json.dumps({"skipped": "torch.distributed with gloo is not importable by %s: %s"
                          % (sys.executable, e)}))
        return 0
    figures = []
    if args.local_ranks >= 2:  # first: its ranks are forked, and CUDA must not be initialised before
        figures.append(all_to_all(args))
    if args.gpu:
        figures.extend(gpu_figures(args))
    if args.rack_size >= 2 and args.rack_master:
        figures.append(rack_all_reduce(args))
    print(json.dumps({"figures": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
