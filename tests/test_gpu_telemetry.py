"""Issue 25: every heartbeat carries each GPU's health, sampled off the
heartbeat's thread through NVML loaded at run time, and /metrics shows it
per node and GPU. This machine has no GPU: the agent loads a stand-in
libnvidia-ml (src/agent/fake_nvml.cc, NVML's signatures: 8 GPUs, GPU 3
thermally throttled at 1,410 MHz) named by TRAINGUARD_NVML_LIBRARY."""

import os
import re
import subprocess
import urllib.request

from conftest import FAKE_NVML, Job, PYTHON, TRAINGUARD, api_url, wait_for



def gpu_samples(url):
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("trainguard_gpu_"):
                found[(s.name, s.labels.get("node"), s.labels.get("gpu"), s.labels.get("reason"))] = s.value
    return found


def test_each_gpus_health_reaches_metrics_by_node_and_index(tmp_path, no_leftovers):
    # Idle until the test has read the gauges (at most 2 minutes).
    script = tmp_path / "idle.py"
    done = tmp_path / "done"
    script.write_text("import os, time\nfor _ in range(1200):\n    if os.path.exists(%r):\n        break\n"
                      "    time.sleep(0.1)\n" % str(done))
    job = Job(tmp_path, "gpu-health", [PYTHON, str(script)], nnodes=2, nproc=1,
              flags=["--heartbeat-interval", "0.5", "--gpu-series-interval", "1"],
              env={"TRAINGUARD_NVML_LIBRARY": FAKE_NVML})
    url = api_url(job)
    # Each node's first sample comes with one of its heartbeats after the
    # first: wait for both nodes' (not one node's) before reading them.
    wanted = [("trainguard_gpu_temperature_celsius", node, str(gpu), None) for node in ("node0", "node1")
              for gpu in range(8)]
    samples = wait_for(lambda: (lambda s: s if all(k in s for k in wanted) else None)(gpu_samples(url))
                       or job.proc.poll() is not None, 60, "GPU gauges of both nodes")
    if not isinstance(samples, dict):
        done.write_text("")
    assert isinstance(samples, dict), job.output()[-2000:]
    for node in ("node0", "node1"):
        assert samples[("trainguard_gpu_sm_clock_hertz", node, "3", None)] == 1410e6
        assert samples[("trainguard_gpu_sm_clock_hertz", node, "0", None)] == 1980e6
        assert samples[("trainguard_gpu_temperature_celsius", node, "3", None)] == 91
        assert samples[("trainguard_gpu_power_watts", node, "3", None)] == 653
        assert samples[("trainguard_gpu_utilization_ratio", node, "5", None)] == 0.95
        assert samples[("trainguard_gpu_nvlink_errors", node, "0", None)] == 8
        assert samples[("trainguard_gpu_throttled", node, "3", "hw_thermal_slowdown")] == 1
    assert not any(k[0] == "trainguard_gpu_throttled" and k[2] != "3" for k in samples), samples
    # The series in the store: a few one-second intervals of every GPU.
    page = tmp_path / "sm.html"
    argv = [TRAINGUARD, "heatmap", "--store", job.store, job.job_id, "--gpu", "sm_clock", "-o", str(page)]
    wait_for(lambda: subprocess.run(argv, capture_output=True).returncode == 0 and
             page.read_text().count("class=\"row") == 16 or job.proc.poll() is not None, 60, "every GPU's series")
    # The dashboard's picture, from the API: the same rows.
    with urllib.request.urlopen(url + "/api/v1/heatmap?gpu=sm_clock&format=svg", timeout=10) as r:
        svg = r.read().decode()
        assert r.headers["Content-Type"] == "image/svg+xml"
    assert re.findall(r'data-row="([^"]+)"', svg)[:8] == ["node0/gpu %d" % g for g in range(8)], svg[:500]
    done.write_text("")
    assert job.wait(timeout=120) == 0, job.output()[-2000:]
    html = page.read_text()
    rows = re.findall(r'data-row="([^"]+)"', html)
    assert rows == ["node%d/gpu %d" % (n, g) for n in (0, 1) for g in range(8)], rows
    throttled = re.findall(r'<g class="row throttled" data-row="([^"]+)"', html)
    assert throttled == ["node0/gpu 3", "node1/gpu 3"], throttled
    assert re.search(r"<li>node0/gpu 3: [a-z_, ]*hw_thermal_slowdown", html), html[-500:]
    assert ">1410</text>" in html and ">1980</text>" in html
    wrong = subprocess.run([TRAINGUARD, "heatmap", "--store", job.store, job.job_id, "--gpu", "fan", "-o",
                            str(tmp_path / "x.svg")], capture_output=True, text=True)
    assert wrong.returncode == 1 and "--gpu fan: not a GPU figure (sm_clock, memory_clock" in wrong.stderr, wrong.stderr


def test_a_node_whose_gpu_reports_new_ecc_errors_is_watched_and_evicted_when_it_stalls_the_job(tmp_path,
                                                                                               no_leftovers):
    """A GPU's uncorrected ECC count grows on node1 while the job trains:
    the node is said at once and watched; when its rank then stalls the job,
    the hang's culprit node is evicted for the spare, not merely restarted
    (an unwatched node's stall restarts in place: test_hang_location.py)."""
    ecc = tmp_path / "ecc"
    ecc.mkdir()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_ddp.py")
    job = Job(tmp_path, "gpu-watch",
              [PYTHON, script, "--steps", "120", "--step-delay", "0.05", "--sleep-rank", "1", "--sleep-at-step",
               "40", "--ckpt", str(tmp_path / "ck.pt"), "--out", str(tmp_path / "sum.txt")],
              nnodes=2, nproc=1,
              flags=["--spares", "1", "--hang-timeout", "6", "--heartbeat-interval", "0.5", "--stop-grace", "1"],
              env={"TRAINGUARD_NVML_LIBRARY": FAKE_NVML, "TG_FAKE_NVML_ECC_DIR": str(ecc)})
    wait_for(lambda: (job.page_step("node1", 1) or -1) >= 5 or job.proc.poll() is not None,
             120, "step 5 of rank 1")
    (ecc / "node1").write_text("2\n")  # GPU 3 of node1: two uncorrected ECC errors
    said = wait_for(lambda: job.events("gpu_errors") or job.proc.poll() is not None, 60, "the gpu_errors event")
    assert said and said[0]["node"] == "node1", job.output()[-2000:]
    assert "uncorrected" in said[0]["message"], said[0]
    assert job.wait(timeout=300) == 0, job.output()[-3000:]
    attribution = job.events("attribution")[0]["detail"]
    assert attribution["culprit_nodes"] == ["node1"], attribution
    decision = job.events("decision")[0]["detail"]
    assert decision["decision"] == "evict_node", decision
    assert "node node1 is watched: GPU errors:" in decision["reason"], decision
    assert [e["node"] for e in job.events("node_evicted")] == ["node1"]
    nodes = subprocess.run([TRAINGUARD, "nodes", "--store", job.store, "--json"], capture_output=True, text=True,
                           timeout=30, check=True).stdout
    assert "gpu-errors" in nodes, nodes
