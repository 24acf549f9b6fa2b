"""Issue 25: every heartbeat carries each GPU's health, sampled off the
heartbeat's thread through NVML loaded at run time, and /metrics shows it
per node and GPU. This machine has no GPU: the agent loads a stand-in
libnvidia-ml (src/agent/fake_nvml.cc, NVML's signatures: 8 GPUs, GPU 3
thermally throttled at 1,410 MHz) named by TRAINGUARD_NVML_LIBRARY."""

import os
import urllib.request

from conftest import BUILD, PYTHON, Job, api_url, wait_for

FAKE_NVML = os.path.join(BUILD, "src", "agent", "libfake_nvml.so")


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
              flags=["--heartbeat-interval", "0.5"], env={"TRAINGUARD_NVML_LIBRARY": FAKE_NVML})
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
    done.write_text("")
    assert job.wait(timeout=120) == 0, job.output()[-2000:]
