"""The controller under a fleet's load, through the real transport.

bench/fleet_load_bench plays many agents over gRPC (a connection each)
against a real `trainguard controller` process. Here it runs small (200
nodes x 8 ranks), and the controller is frozen with SIGSTOP for 10 s while
the agents go on: twice the 5-heartbeat limit. No healthy node may be
declared lost for the controller's own stall, and a failure afterwards
must still reach every node and restart all of them.
"""
import os
import re
import subprocess

from conftest import BUILD, TRAINGUARD

BENCH = os.path.join(BUILD, "bench", "fleet_load_bench")


def run_bench(tmp_path, *args):
    out = subprocess.run([BENCH, "--trainguard", TRAINGUARD, "--dir", str(tmp_path)] + list(args),
                         capture_output=True, text=True, timeout=240)
    result = re.search(r"^RESULT (.*)$", out.stdout, re.M)
    assert result, "no RESULT line:\n" + out.stdout + out.stderr
    figures = dict(kv.split("=") for kv in result.group(1).split())
    return out, figures


def test_a_frozen_controller_drops_no_healthy_node(tmp_path):
    out, f = run_bench(tmp_path, "--nodes", "200", "--steady", "2", "--stall", "10")
    assert "controller frozen (SIGSTOP) for 10 s: 0 node(s) dropped" in out.stdout, out.stdout
    assert f["dropped"] == "0" and f["node_lost"] == "0", out.stdout
    # The failure after the stall reached every node and all restarted.
    assert "(200 of 200 nodes)" in out.stdout.split("failure -> every node's Stop")[1].splitlines()[0], out.stdout
    assert float(f["restart_s"]) > 0, out.stdout
    assert out.returncode == 0, out.stdout + out.stderr
    # The controller said it stalled (its event is in the store the bench read).
    assert int(f["stalls"]) >= 1, out.stdout
