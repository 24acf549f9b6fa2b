"""Issue 25, part 3: `trainguard diag` alone measures the GPUs (each GPU's
half-precision GEMM and pinned host<->device copies, with the job's PyTorch)
and judges them against floors per GPU model and against the node's other
GPUs of the same model. The driver is a stand-in `nvidia-smi` on PATH that
prints NVML's CSV; the probe is the real one where PyTorch has no CUDA (it
says so), and a stand-in interpreter printing what the probe prints on a GPU
where the figures' judging is under test."""

import json
import os
import stat
import subprocess

from conftest import TRAINGUARD

# `nvidia-smi --query-gpu=index,pci.bus_id,ecc...,retired_pages.pending --format=csv,noheader,nounits`
# and the other queries the suite makes, for 8 healthy GPUs.
FAKE_SMI = r"""#!/bin/sh
case "$*" in
  *--query-gpu=*) for i in 0 1 2 3 4 5 6 7; do echo "$i, 00000000:1$i:00.0, 0, No"; done ;;
  *--query-remapped-rows=*) for i in 0 1 2 3 4 5 6 7; do echo "00000000:1$i:00.0, 0, 0"; done ;;
  *nvlink*) exit 0 ;;
  *) exit 2 ;;
esac
"""

MODEL = "NVIDIA H100 80GB HBM3"


def write_exe(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def fake_probe(tmp_path, slow_gpu):
    """An interpreter that records how it was called and prints the probe's
    result for 8 H100s, GPU `slow_gpu` at about half speed."""
    figures = []
    for i in range(8):
        figures.append({"name": "gpu_gemm_tflops:%d" % i, "value": 380.0 if i == slow_gpu else 700.0 + i,
                        "device": MODEL})
        figures.append({"name": "gpu_known_answer_mismatches:%d" % i, "value": 0.0, "device": MODEL})
        figures.append({"name": "gpu_h2d_gbps:%d" % i, "value": 52.0, "device": MODEL})
        figures.append({"name": "gpu_d2h_gbps:%d" % i, "value": 50.0, "device": MODEL})
    out = json.dumps({"figures": figures})
    calls = tmp_path / "probe-calls"
    return write_exe(tmp_path / "fake-python", "#!/bin/sh\necho \"$@\" >> '%s'\ncat <<'EOF'\n%s\nEOF\n" % (calls, out)), calls


def diag(tmp_path, *args):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    write_exe(bindir / "nvidia-smi", FAKE_SMI)
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]))
    env.pop("TRAINGUARD_PYTHON", None)
    done = subprocess.run([TRAINGUARD, "diag", "--no-store", "--json", "--path", "scratch=%s" % tmp_path, *args],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode in (0, 1), done.stderr
    node = json.loads(done.stdout)["nodes"][0]
    return done.returncode, node, {f["name"]: f for f in node["figures"]}


def test_diag_alone_measures_each_gpu_and_names_the_slow_one_among_its_others(tmp_path):
    python, calls = fake_probe(tmp_path, slow_gpu=5)
    rc, node, figures = diag(tmp_path, "--python", python)
    # The probe ran once (a node below only its peers is measured again;
    # here the slow GPU fails against the node's own GPUs, so twice).
    lines = calls.read_text().splitlines()
    assert 1 <= len(lines) <= 2, lines
    assert lines[0].split()[0].endswith("trainguard/_collective_probe.py") and "--gpu" in lines[0].split(), lines
    assert figures["gpu_count"]["value"] == 8
    for i in range(8):
        assert figures["gpu_gemm_tflops:%d" % i]["device"] == MODEL
        assert figures["gpu_h2d_gbps:%d" % i]["ok"] and figures["gpu_d2h_gbps:%d" % i]["ok"]
    assert rc == 1 and not node["healthy"]
    slow = figures["gpu_gemm_tflops:5"]
    assert not slow["ok"]
    assert "of this node's 7 other %s GPUs (min 70 %%)" % MODEL in slow["failure"], slow
    assert [f for f in node["failures"] if f.startswith("gpu_")] == [slow["failure"]]


def test_diag_with_a_pytorch_that_sees_no_cuda_says_so_and_does_not_fail_the_node(tmp_path):
    # The real probe with Debian's CPU-only PyTorch, while the driver lists 8 GPUs.
    rc, node, figures = diag(tmp_path, "--python", "/usr/bin/python3")
    probe = figures["collective_probe"]
    assert "sees no CUDA device" in probe["error"], probe
    assert probe["ok"]  # shown, not judged: a wrong interpreter is no node fault
    assert not [n for n in figures if n.startswith("gpu_gemm")]
    assert not [f for f in node["failures"] if "collective_probe" in f or f.startswith("gpu_")], node["failures"]


def test_no_gpu_compute_skips_the_probe_and_a_node_without_gpus_never_runs_it(tmp_path):
    python, calls = fake_probe(tmp_path, slow_gpu=5)
    _, _, figures = diag(tmp_path, "--python", python, "--no-gpu-compute")
    assert not calls.exists()
    assert figures["gpu_count"]["value"] == 8 and "gpu_gemm_tflops:0" not in figures
    # No nvidia-smi at all: a CPU node; no GPU figures, no probe.
    env = dict(os.environ, PATH="/usr/bin:/bin")
    done = subprocess.run([TRAINGUARD, "diag", "--no-store", "--json", "--python", python,
                           "--path", "scratch=%s" % tmp_path], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode in (0, 1), done.stderr
    names = [f["name"] for f in json.loads(done.stdout)["nodes"][0]["figures"]]
    assert not [n for n in names if n.startswith("gpu_")], names
    assert not calls.exists()
