"""Issue 10, part 1: the rules cover the published catalogs, not only the logs
at hand. Every Xid of NVIDIA's catalog (and any newer number), every CUDA
runtime/driver error name, every NCCL result code and every RDMA
work-completion status and adapter event gets the category the catalogs call
for, in the forms logs print them. The tables are
rules/catalogs/*.tsv (facts from NVIDIA's Xid catalog and the CUDA headers;
the scripts beside them say where each comes from)."""

import concurrent.futures
import json
import os
import subprocess
import tempfile

import pytest

from conftest import ROOT, TRAINGUARD

CATALOGS = os.path.join(ROOT, "rules", "catalogs")


def attribute(lines):
    out = subprocess.run([TRAINGUARD, "attribute", "--json", "-"], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def attribute_each(texts):
    """attribute(text.split("\\n")) of each text: `--each` over a share of
    them in each of one process per core (the answers in the texts' order)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, text in enumerate(texts):
            paths.append(os.path.join(tmp, "%d.log" % i))
            with open(paths[-1], "w") as f:
                f.write(text + "\n")
        workers = os.cpu_count() or 1
        share = max(1, -(-len(paths) // workers))

        def run(part):
            out = subprocess.run([TRAINGUARD, "attribute", "--json", "--each", *part], capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            answers = [json.loads(line) for line in out.stdout.splitlines()]
            assert len(answers) == len(part), (len(answers), len(part))
            return answers

        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return [a for part in pool.map(run, [paths[i:i + share] for i in range(0, len(paths), share)])
                    for a in part]


def table(name):
    with open(os.path.join(CATALOGS, name)) as f:
        return [l.rstrip("\n").split("\t") for l in f if l.strip() and not l.startswith("#")]


XIDS = table("nvidia_xid.tsv")


def test_the_xid_table_is_nvidias_whole_catalog():
    assert [int(r[0]) for r in XIDS] == list(range(1, 173))


@pytest.mark.parametrize("form", [
    "NVRM: Xid (PCI:0000:3b:00): {x}, pid=4242, name=python3, something happened",
    "kernel: [ 4909.922970] NVRM: Xid (0000:48:00): {x}, Ch 0000000b",     # a bus id with 48 in it
    "XID {x} reported on GPU 0000:17:00.0",
])
def test_every_xid_of_the_catalog_gets_its_category(form):
    wrong = []
    for (xid, bucket, category, action), a in zip(XIDS, attribute_each([form.format(x=r[0]) for r in XIDS])):
        if (a["category"], a["action"]) != (category, action):
            wrong.append((xid, bucket, category, action, a["category"], a["action"], a["rule"]))
    assert not wrong, wrong


@pytest.mark.parametrize("xid", [173, 199, 250, 1000])
def test_an_xid_newer_than_the_catalog_is_a_gpu_fault_of_unknown_kind(xid):
    a = attribute(["NVRM: Xid (PCI:0000:3b:00): %d, pid=1, new fault" % xid])
    assert (a["category"], a["rule"], a["action"]) == ("gpu_hardware", "gpu-xid-newer", "restart")


def test_every_cuda_error_name_gets_a_category():
    rows = table("cuda_errors.tsv")
    assert len(rows) > 200
    wrong = []
    answers = attribute_each(["RuntimeError: CUDA driver error: %s (%s)" % (name, number) for name, number, _ in rows])
    for (name, number, category), a in zip(rows, answers):
        if a["category"] != category:
            wrong.append((name, category, a["category"], a["rule"]))
    assert not wrong, wrong


@pytest.mark.parametrize("text,category", [
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled cuda error "
     "(run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1 ncclUnhandledCudaError", "cuda_software"),
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled "
     "system error, NCCL version 2.14.3 ncclSystemError: System call (e.g. socket, malloc) or external "
     "library call failed or device error.", "network"),
    ("RuntimeError: NCCL error: internal error - please report this issue to the NCCL developers, "
     "NCCL version 2.17.1 ncclInternalError: Internal check failed.", "cuda_software"),
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, invalid usage (run with NCCL_DEBUG=WARN for "
     "details), NCCL version 2.19.3 ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
     "user_code"),
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, invalid argument (run with NCCL_DEBUG=WARN "
     "for details), NCCL version 2.19.3 ncclInvalidArgument", "user_code"),
])
def test_every_nccl_error_result_code_gets_a_category(text, category):
    assert attribute([text])["category"] == category


def test_ncclremoteerror_alone_is_a_symptom_of_a_peer():
    a = attribute(["torch.distributed.DistBackendError: NCCL error: remote process exited or there was a "
                   "network error, NCCL version 2.18.1 ncclRemoteError"])
    assert a["rule"] == "net-peer-reset" and a["role"] == "symptom" and a["raw_confidence"] < 0.5, a


# errno as Python (`OSError: [Errno N] text`) and C libraries (the name) print
# it; the numbers and texts come from this machine's libc through Python.
ERRNO_CATEGORIES = {
    "ENOSPC": "storage", "EDQUOT": "storage", "EFBIG": "storage", "EIO": "storage", "EROFS": "storage",
    "ESTALE": "storage", "ENOMEM": "oom", "EMFILE": "other", "ENFILE": "other", "EADDRINUSE": "other",
    "ENETDOWN": "network", "ENETUNREACH": "network", "EHOSTUNREACH": "network", "EHOSTDOWN": "network",
    "ECONNRESET": "network", "ECONNREFUSED": "network", "ECONNABORTED": "network", "ETIMEDOUT": "network",
    "EPIPE": "network", "ENOENT": "user_code", "EACCES": "user_code",
}


def test_errnos_as_python_and_c_print_them_get_their_category():
    import errno
    cases = []
    for name, category in ERRNO_CATEGORIES.items():
        number = getattr(errno, name)
        for form in ("OSError: [Errno %d] %s" % (number, os.strerror(number)),
                     "write failed: %s (%s)" % (name, os.strerror(number))):
            cases.append((form, category))
    wrong = [(form, category, a["category"], a["rule"])
             for (form, category), a in zip(cases, attribute_each([form for form, _ in cases]))
             if a["category"] != category]
    assert not wrong, wrong


def test_no_errno_is_read_as_a_hardware_fault():
    import errno
    hardware = []
    codes = sorted(errno.errorcode.items())
    texts = ["OSError: [Errno %d] %s\nerrno %s" % (number, os.strerror(number), name) for number, name in codes]
    for (number, name), a in zip(codes, attribute_each(texts)):
        if a["hardware"] and name not in ("EIO", "ESTALE", "EROFS", "ENETDOWN", "ENETUNREACH", "EHOSTUNREACH",
                                          "EHOSTDOWN"):
            hardware.append((name, a["rule"]))
    assert not hardware, hardware


IBV = table("ibv_wc_status.tsv")


def test_the_ibv_table_is_libibverbs_whole_enum():
    wc = [r for r in IBV if r[0] == "wc"]
    events = [r for r in IBV if r[0] == "event"]
    assert [int(r[1]) for r in wc] == list(range(24)) and [int(r[1]) for r in events] == list(range(20))


def test_every_rdma_completion_status_gets_its_category_by_number_name_and_text():
    """NCCL prints the number ("with status=12", older "with error 12"),
    other stacks the enum name or libibverbs' text for it. A status that is
    the software's or its setup's (memory registration, access rights) must
    not send a node out as a fabric fault; a retry or timeout must."""
    cases = []
    for kind, number, name, text, category in IBV:
        if kind != "wc" or category == "-":
            continue
        forms = ["h:1:2 [0] transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion from peer 10.1.3.2<33057> "
                 "with status=%s opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1" % number,
                 "h:1:2 [0] NCCL WARN NET/IB : Got completion with error %s, opcode 0, len 0, vendor err 129" % number,
                 "ibv_poll_cq: work completion %s failed" % name,
                 "Completion with error: %s (status %s)" % (text, number)]
        cases += [(form, category) for form in forms]
    wrong = [(form, category, a["category"], a["rule"])
             for (form, category), a in zip(cases, attribute_each([form for form, _ in cases]))
             if a["category"] != category]
    assert not wrong, wrong


def test_every_adapter_async_event_gets_its_category():
    events = [(text, category if category != "-" else "other")
              for kind, number, name, text, category in IBV if kind == "event"]
    lines = ["h:1:2 [0] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_0:1 Got async event : %s" % text
             for text, _ in events]
    wrong = [(text, expected, a["category"], a["rule"])
             for (text, expected), a in zip(events, attribute_each(lines)) if a["category"] != expected]
    assert not wrong, wrong


def test_nvswitch_sxids_fatal_and_non_fatal():
    fatal = attribute(["nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 44 sourcetrack timeout error (First)"])
    assert fatal["category"] == "gpu_hardware" and fatal["action"] == "evict_node", fatal
    nonfatal = attribute(["nvidia-nvswitch3: SXid (PCI:0000:8b:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV "
                          "error (First)"])
    assert nonfatal["rule"] == "gpu-sxid-nonfatal" and nonfatal["action"] != "evict_node", nonfatal


@pytest.mark.parametrize("code,category", [("1", "cuda_software"), ("2", "network"), ("3", "cuda_software"),
                                           ("4", "user_code"), ("5", "user_code"), ("6", "network")])
def test_an_nccl_return_chain_alone_says_what_kind_of_error_began_it(code, category):
    chain = ["h:984:1357 [4] NCCL INFO transport/net.cc:1298 -> %s" % code,
             "h:984:1357 [4] NCCL INFO proxy.cc:694 -> %s" % code,
             "h:984:1357 [4] NCCL INFO proxy.cc:874 -> %s [Progress Thread]" % code]
    a = attribute(chain)
    assert a["category"] == category and a["role"] == "symptom", a   # a trace, not the cause itself


def test_the_warning_that_began_a_chain_outranks_the_chain():
    a = attribute(["h:1:2 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4> with status=12 "
                   "opcode=129 len=65536 vendor err 129 (Recv)",
                   "h:1:2 [4] NCCL INFO transport/net.cc:1298 -> 6",
                   "h:1:2 [4] NCCL INFO proxy.cc:694 -> 6"])
    assert a["category"] == "network" and a["rule"] == "net-completion-error", a


CUDA_STRINGS = table("cuda_error_strings.tsv")


def test_every_cuda_error_text_gets_the_category_of_its_name():
    """PyTorch prints the runtime's text, not the name: "CUDA error: <text>",
    and older builds "cuda runtime error (N) : <text>". The texts are the
    toolkit's own (cudaGetErrorString), one per cudaError_t."""
    names = {name: category for name, number, category in table("cuda_errors.tsv")}
    assert len(CUDA_STRINGS) > 100
    cases = []
    for number, name, text, category in CUDA_STRINGS:
        assert names[name] == category, name
        for form in ("RuntimeError: CUDA error: %s" % text,
                     "RuntimeError: cuda runtime error (%s) : %s at /pytorch/aten/src/THC/THCGeneral.cpp:50" % (number, text)):
            cases.append((form, category))
    wrong = [(form, category, a["category"], a["rule"])
             for (form, category), a in zip(cases, attribute_each([form for form, _ in cases]))
             if a["category"] != category]
    assert not wrong, wrong


@pytest.mark.parametrize("line,category", [
    ("h:1:2 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device", "storage"),
    ("h:1:2 [6] misc/shmutils.cc:71 NCCL WARN Error: failed to extend /dev/shm/nccl-fjwOOB to 5967876 bytes", "storage"),
    ("h:1:2 [3] misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-KWfVyt "
     "(size 5967872)", "storage"),
    ("h:1:2 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment /dev/shm/nccl-glnlGK "
     "(size 14156128), error: No such file or directory (2)", "cuda_software"),
])
def test_nccl_shared_memory_warnings(line, category):
    """NCCL's /dev/shm transport: a segment it cannot create or grow means
    shared memory is full (storage); one it cannot attach to vanished under it
    (the NCCL software), not a missing user file."""
    assert attribute([line])["category"] == category
