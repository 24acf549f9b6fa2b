"""Issue 10, precision and robustness: binary garbage, invalid UTF-8 and
ordinary healthy training output give no hardware finding and no eviction,
and nothing crashes on them: not `trainguard attribute`, not a running job
whose rank prints them (its output must not cost the node its session), not
a command line that is not UTF-8."""

import json
import os
import random
import subprocess

import pytest

from conftest import PYTHON, TRAINGUARD, events

HEALTHY = "\n".join(
    ["epoch %d step %d loss %.4f lr 3e-4 grad_norm 0.91" % (e, s, 2.5 / (1 + s)) for e in range(3) for s in range(200)]
    + ["\r 45%%|%s%s| %d/200 [00:12<00:14, 12.5it/s]" % ("█" * k, " " * (20 - k), k * 10) for k in range(21)]
    + ["UserWarning: This DataLoader will create 16 worker processes in total.",
       "NCCL INFO Channel 05/0 : 3[3] -> 4[4] via P2P/CUMEM/read",
       "NCCL INFO comm 0x55d0c1e0 rank 3 nranks 64 cudaDev 3 busId 4f000 - Init COMPLETE",
       "tensor([[ 0.1234, -1.2e+03, nan_guard=0 ], [ 3.1416, 2.7183, 1.4142 ]])",
       "Saving checkpoint to /ckpt/step_4700 ... done (12.4 GB in 3.1 s)"]
    + [" ".join("%.6e" % (random.Random(i).random() * 1e6) for _ in range(500)) for i in range(50)]) + "\n"


def hostile_inputs(tmp_path):
    rnd = random.Random(20261123)
    files = {}
    files["random.bin"] = bytes(rnd.getrandbits(8) for _ in range(5 << 20))
    files["invalid_utf8.log"] = (b"step 1 loss 0.5\n\xff\xfe\xfd broken \xe2\x96\n"
                                 b"cut in the middle \xe6\x97\xa5\xe6\x9c\n" + b"\xc0\xaf" * 100 + b"\n")
    files["healthy.log"] = HEALTHY.encode()
    paths = []
    for name, data in files.items():
        p = tmp_path / name
        p.write_bytes(data)
        paths.append(str(p))
    return paths


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_attribute_survives_garbage_and_finds_no_hardware_in_it(tmp_path, json_flag):
    for path in hostile_inputs(tmp_path):
        out = subprocess.run([TRAINGUARD, "attribute", *json_flag, path], capture_output=True, timeout=120)
        assert out.returncode == 0, (path, out.stderr[-2000:])
        if json_flag:
            a = json.loads(out.stdout.decode("utf-8"))   # valid UTF-8 JSON
            assert not a["hardware"] and a["action"] != "evict_node", (path, a)
        else:
            assert b"evict_node" not in out.stdout and b"(hardware" not in out.stdout, (path, out.stdout)


def test_a_rank_printing_binary_garbage_does_not_cost_its_node(tmp_path, no_leftovers):
    script = tmp_path / "garbage.py"
    script.write_text("import os, random, sys\n"
                      "r = random.Random(5)\n"
                      "for _ in range(200):\n"
                      "    sys.stdout.buffer.write(bytes(r.getrandbits(8) for _ in range(300)) + b'\\n')\n"
                      "sys.stdout.buffer.write(b'progress \\xe2\\x96 cut\\n'); sys.stdout.flush()\n"
                      "with open(sys.argv[1], 'wb') as f: f.write(os.fsencode(sys.argv[2]))\n"
                      "sys.exit(1 if os.environ['RANK'] == '1' else 0)\n")
    store = str(tmp_path / "tg.db")
    odd_arg = b"caf\xe9-latin1".decode("utf-8", "surrogateescape")   # not UTF-8, as some shells pass it
    done = subprocess.run(
        [TRAINGUARD, "run", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
         "--store", store, "--job-id", "garbage", "--run-dir", str(tmp_path / "run"), "--",
         PYTHON, str(script), str(tmp_path / "arg"), odd_arg],
        capture_output=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    evs = events(store, "garbage")
    kinds = [e["kind"] for e in evs]
    assert "node_lost" not in kinds, kinds
    failure = [e for e in evs if e["kind"] == "failure"][0]
    assert failure["detail"]["failure_kind"] == "rank_failed" and failure["rank"] == 1
    attribution = [e for e in evs if e["kind"] == "attribution"][0]["detail"]
    assert not attribution["hardware"] and attribution["decision"] != "evict_node", attribution
    # The rank got its argument byte for byte.
    assert (tmp_path / "arg").read_bytes() == b"caf\xe9-latin1"
