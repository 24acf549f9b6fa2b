"""Shared helpers for trainguard's end-to-end tests: real processes, real
PyTorch DDP on gloo, a real SQLite store. Nothing here sleeps to hope: every
wait polls a condition with a deadline."""

import glob
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from leftovers import processes  # noqa: E402  (the walk over /proc, shared)
BUILD = os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build"))
TRAINGUARD = os.path.join(BUILD, "trainguard")
EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")
PYTHON = "/usr/bin/python3"
# A stand-in for the driver's NVML (src/agent/fake_nvml.cc): this machine has no GPU.
FAKE_NVML = os.path.join(BUILD, "src", "agent", "libfake_nvml.so")


def gpu_fault_env(tmp_path):
    """The environment under which examples/train_ddp.py --xid-at-step makes
    its GPU fail as a real one does: the driver reports Xid 79 through NVML
    (the stand-in, read by the agents) while the rank dies with CUDA's launch
    failure. Without it the rank's log line alone is a suspicion, not an
    eviction (docs/attribution.md, "Corroboration")."""
    xids = os.path.join(str(tmp_path), "xids")
    os.makedirs(xids, exist_ok=True)
    return {"TRAINGUARD_NVML_LIBRARY": FAKE_NVML, "TG_FAKE_NVML_XID_DIR": xids}


# Test tiers (docs/testing.md). What a test needs, by file: `root` (network
# namespaces, cgroups, tmpfs), `slurm` (a Slurm cluster of real daemons),
# `postgres` (a PostgreSQL server it starts), `browser` (headless Chromium);
# `slow` for files whose tests run real multi-node jobs for tens of seconds
# each; `serial` for tests whose timing needs a quiet machine (a file here,
# or @pytest.mark.serial on the test). `scripts/test.sh` runs everything: all
# but `serial` in parallel (pytest-xdist, a file's tests on one worker), then
# `serial` alone; `scripts/test.sh --quick` runs `-m "not slow"`.
TIERS = {
    "test_alerts.py": ("slow",),
    "test_api.py": ("slow",),
    "test_auth.py": ("slow",),
    "test_autoinstrument.py": ("slow",),
    "test_checkpoint_kill.py": ("slow",),
    "test_checkpoint_plan_live.py": ("slow",),
    "test_checkpoint_tiers_live.py": ("slow",),
    "test_controller_capacity.py": ("slow", "serial"),
    "test_controller_restart.py": ("slow",),
    "test_dashboard.py": ("browser", "slow"),
    "test_diag.py": ("root", "slow"),
    "test_fleet_store.py": ("postgres", "slow"),
    "test_gpu_telemetry.py": ("slow",),
    # serial: a 3 s hang timeout, which a healthy rank starved of CPU by other
    # tests' jobs can exceed (a second, real, incident).
    "test_hang_location.py": ("slow", "serial"),
    "test_install.py": ("slow",),
    "test_multi_host.py": ("root", "slow"),
    "test_netns.py": ("root", "slow"),
    "test_oom_kill.py": ("root", "slow"),
    "test_slurm.py": ("slurm", "root", "slow"),
    "test_spares_and_cordon.py": ("slow",),
    # serial: a controller's lead lasts 6 s unrenewed and each takeover is
    # timed; a leader starved of CPU by other tests' jobs for 4 s would lose
    # its lead (a second, real, takeover).
    "test_standby.py": ("postgres", "root", "slow", "serial"),
    "test_store_outage.py": ("postgres", "slow"),
    "test_stragglers.py": ("root", "slow"),
    "test_warm_start.py": ("slow",),
    "test_sdc.py": ("slow",),
    "test_storage.py": ("root", "slow"),
}
MARKERS = {
    "slow": "runs real multi-node jobs for tens of seconds (left out of scripts/test.sh --quick)",
    "serial": "its timing needs a quiet machine: runs alone, after the parallel part",
    "root": "needs root: network namespaces, cgroups or tmpfs mounts",
    "slurm": "starts a Slurm cluster of real daemons",
    "postgres": "starts a PostgreSQL server",
    "browser": "drives headless Chromium",
}


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", "%s: %s" % (name, what))


# Fixtures that throttle one node's CPU (cpu_cgroup) so that its pace is judged
# against its peers': on a machine busy with other tests the peers slow as
# well, and the margin the test relies on shrinks. Their tests are `serial`.
SERIAL_FIXTURES = {"slow_cpu", "half_cpu"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in TIERS.get(os.path.basename(str(item.fspath)), ()):
            item.add_marker(getattr(pytest.mark, name))
        if SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serial)


def _cpu_snapshot():
    """{pid: (cpu seconds, command)} of every process, and the machine's /proc/stat CPU line."""
    tick = os.sysconf("SC_CLK_TCK")
    procs = {pid: ((int(fields[11]) + int(fields[12])) / tick, cmd[:160]) for pid, fields, cmd in processes()}
    with open("/proc/stat") as f:
        machine = [int(x) for x in f.readline().split()[1:]]
    return procs, machine


def _cpu_use_text(before, after, seconds):
    """Who used the CPU between two snapshots: the machine's busy and steal
    shares, then the ten processes that used the most (the ones that ended in
    between are not seen)."""
    (p0, m0), (p1, m1) = before, after
    d = [b - a for a, b in zip(m0, m1)]
    total = sum(d) or 1
    busy = total - d[3] - d[4]  # idle, iowait
    steal = d[7] if len(d) > 7 else 0
    lines = ["machine over %.0f s: %d CPUs, busy %.0f %%, steal %.0f %%" % (
        seconds, os.cpu_count(), 100 * busy / total, 100 * steal / total)]
    used = sorted(((t - p0.get(pid, (0, ""))[0], pid, cmd) for pid, (t, cmd) in p1.items()), reverse=True)
    lines += ["%7.1f s  pid %d  %s" % (u, pid, cmd or "?") for u, pid, cmd in used[:10] if u >= 0.1]
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def cpu_use_on_failure(request):
    """A serial test needs a quiet machine: where one fails, its report says
    whether the machine was (busy and steal shares, the processes that used
    the CPU while it ran)."""
    if request.node.get_closest_marker("serial") is not None:
        request.node.cpu_before = (_cpu_snapshot(), time.monotonic())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    before = getattr(item, "cpu_before", None)
    if before is not None and report.when == "call" and report.failed:
        snapshot, started = before
        report.sections.append(("CPU use while the test ran",
                                _cpu_use_text(snapshot, _cpu_snapshot(), time.monotonic() - started)))


@pytest.fixture(autouse=True)
def private_tmpdir(monkeypatch):
    """Every test's processes get a TMPDIR of the test's own, removed after
    the test: a rank killed with SIGKILL cannot remove what it made there
    (multiprocessing's pymp-*, Chromium's profile), and trainguard's default
    run directory (--run-dir) is below it. Short (/tmp/tgt-XXXXXXXX), as
    AF_UNIX socket paths below it must be; made before TMPDIR is changed, so
    in /tmp. (scripts/leftovers.py checks that the run left nothing.)"""
    path = tempfile.mkdtemp(prefix="tgt-")
    monkeypatch.setenv("TMPDIR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def alive(pid):
    """Whether a process (or its zombie, not yet reaped) is there."""
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def wait_for(predicate, timeout, what):
    """Polls `predicate` until it returns a truthy value; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(0.05)


def events(store, job_id):
    if store.startswith("postgresql://"):
        done = subprocess.run([TRAINGUARD, "events", "--store", store, "--json", job_id],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return []
        return [dict(kind=e["kind"], node=e["node"], rank=e["rank"], generation=e["generation"], step=e["step"],
                     message=e["message"], detail=e["detail"], wall_ns=e.get("time_unix_ns"))
                for e in json.loads(done.stdout)]
    if not os.path.exists(store):
        return []
    con = sqlite3.connect(store, timeout=5)
    try:
        rows = con.execute(
            "SELECT kind, node, rank, generation, step, message, detail_json, wall_ns "
            "FROM events WHERE job_id=? ORDER BY id", (job_id,)).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()
    return [dict(kind=k, node=n, rank=r, generation=g, step=s, message=m,
                 detail=json.loads(d), wall_ns=w) for k, n, r, g, s, m, d, w in rows]


def status_page_step(job_id, node, rank, agent_pid=None):
    """Reads a rank's current step straight from its shared-memory status page
    (layout: docs/status_page.md), trainguard-JOB-NODE-AGENTPID-rRANK: the
    page of `agent_pid`'s rank, or the one such page there is (another test
    may run a job of the same id)."""
    if agent_pid is None:
        found = glob.glob("/dev/shm/trainguard-%s-%s-[0-9]*-r%d" % (glob.escape(job_id), glob.escape(node), rank))
        if len(found) != 1:
            return None
        path = found[0]
    else:
        path = "/dev/shm/trainguard-%s-%s-%d-r%d" % (job_id, node, agent_pid, rank)
    try:
        with open(path, "rb") as f:
            data = f.read(48)
    except OSError:
        return None
    if len(data) < 48:
        return None
    return struct.unpack_from("<q", data, 32)[0]


def processes_mentioning(token):
    """Pids of live processes whose command line contains `token`."""
    me = os.getpid()
    return [pid for pid, fields, cmd in processes() if pid != me and token in cmd and fields[0] != "Z"]


_next_port = []


def free_port():
    """A port nothing listens on, for a server a test starts. Below the
    kernel's ephemeral range (net.ipv4.ip_local_port_range), so that no
    outgoing connection of a test running in parallel takes it as its source
    port between now and the server's bind (seen once: a controller that
    could not listen, and a test that waited for steps that never came), and
    in a block of this xdist worker's own, so that two workers never hand out
    the same one."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    block = 1000
    base = 10000 + index * block
    assert base + block <= ephemeral_low, "no room below the ephemeral ports for worker %s" % worker
    if not _next_port:
        _next_port.append(0)
    for _ in range(block):
        port = base + _next_port[0] % block
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or still in TIME_WAIT): the next one
            return port
    raise AssertionError("no free port in %d-%d" % (base, base + block - 1))


def plain_example_checksum(tmp, steps, world=4, nproc=2):
    """The example job's final parameters, run plainly: `world` processes with
    torchrun's environment, no supervisor, no trainguard (torch.save checkpoints)."""
    return plain_checksum(tmp, [PYTHON, EXAMPLE, "--steps", str(steps), "--ckpt-every", "20", "--ckpt-engine",
                                "torch", "--ckpt-dir", os.path.join(str(tmp), "ckpt"),
                                "--out", os.path.join(str(tmp), "sum")], world, nproc)


def plain_checksum(tmp, argv, world=4, nproc=2):
    """Runs `argv` (which writes its final checksum to TMP/sum) as `world`
    processes with torchrun's environment, no supervisor, no trainguard."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank % nproc), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0")
        env.pop("PYTHONPATH", None)
        procs.append(subprocess.Popen(argv, env=env, cwd=str(tmp), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()[-2000:]
    with open(os.path.join(str(tmp), "sum")) as f:
        return f.read().strip()


class Job:
    """A `trainguard run` of the example (or any command) in the background."""

    def __init__(self, tmp_path, job_id, command, *, nnodes=2, nproc=2, flags=(), store=None, env=None):
        self.tmp = str(tmp_path)
        self.job_id = job_id
        self.store = store or os.path.join(self.tmp, "trainguard.db")
        self.log = os.path.join(self.tmp, "run.log")
        argv = [TRAINGUARD, "run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
                "--store", self.store, "--job-id", job_id,
                "--run-dir", os.path.join(self.tmp, "run"), *flags, "--", *command]
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT,
                                     cwd=self.tmp, start_new_session=True,
                                     env=None if env is None else dict(os.environ, **env))

    def events(self, kind=None):
        evs = events(self.store, self.job_id)
        return [e for e in evs if kind is None or e["kind"] == kind]

    def rank_pids(self, generation=0):
        pids = {}
        for e in self.events("ranks_started"):
            if e["generation"] == generation:
                pids.update({int(r): p for r, p in e["detail"]["pids"].items()})
        return pids

    def agent_pids(self):
        return {e["node"]: e["detail"]["agent_pid"] for e in self.events("node_registered")}

    def wait(self, timeout=180):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.end()
            raise AssertionError("job %s did not finish in %d s:\n%s\nits events:\n%s" % (
                self.job_id, timeout, self.output()[-3000:], self.event_lines()[-6000:]))
        self._out.close()
        return rc

    def event_lines(self):
        """The job's event log, a line each, for a failure's message."""
        return "\n".join("%s %s %s" % (e["kind"], e["node"], e["message"][:200]) for e in self.events())

    def output(self):
        with open(self.log) as f:
            return f.read()

    def end(self):
        """Ends a job a test gives up on: `run`'s fast shutdown (SIGINT), which
        stops the agents and removes their status pages, then SIGKILL."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def page_step(self, node, rank):
        """Rank `rank`'s step from its status page on `node` (None before it has one)."""
        agent = self.agent_pids().get(node)
        return status_page_step(self.job_id, node, rank, agent) if agent else None

    def settled_standbys(self):
        """Warm standbys the agents made ready, or gave up on, so far. A
        standby imports the script's modules after the first step: nodes
        that share this machine's cores measure each other's imports."""
        return len(re.findall(r"warm standby of local rank \d+ ready|no warm standby for local rank",
                              self.output()))

    def wait_for_quiet(self, standbys, timeout=180):
        """Until `standbys` warm standbys have settled: a diagnosis round
        that judges nodes against each other then measures the nodes, not
        torch's import on a neighbour sharing the cores."""
        wait_for(lambda: self.settled_standbys() >= standbys or self.proc.poll() is not None, timeout,
                 "%d warm standbys" % standbys)
        assert self.proc.poll() is None, self.output()[-3000:]


def api_url(job, timeout=60):
    """The controller's HTTP API address, from the line `run` prints at start."""
    pattern = r"API and metrics at (http://\S+)"
    wait_for(lambda: re.search(pattern, job.output()) or job.proc.poll() is not None, timeout,
             "the API's address in the job's output")
    found = re.search(pattern, job.output())
    assert found, job.output()[-3000:]
    return found.group(1)


@pytest.fixture
def no_leftovers(tmp_path):
    """After the test, no process that mentions the test's directory may run."""
    yield
    token = str(tmp_path)
    try:
        wait_for(lambda: not processes_mentioning(token), 10, "the job's processes to exit")
    finally:
        for pid in processes_mentioning(token):  # clean up before failing the test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def cpu_cgroup(name, fraction, period=100000):
    """A cgroup (v2 or v1) whose processes get `fraction` of one CPU in every
    `period` microseconds; its path, or None."""
    quota = int(period * fraction)
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "cpu" not in f.read().split():
                return None
        path = "/sys/fs/cgroup/" + name
        os.mkdir(path)
        with open(path + "/cpu.max", "w") as f:
            f.write("%d %d" % (quota, period))
        return path
    if os.path.isdir("/sys/fs/cgroup/cpu"):
        path = "/sys/fs/cgroup/cpu/" + name
        os.mkdir(path)
        with open(path + "/cpu.cfs_period_us", "w") as f:
            f.write(str(period))
        with open(path + "/cpu.cfs_quota_us", "w") as f:
            f.write(str(quota))
        return path
    return None


def remove_cgroup(path):
    """Removes a cgroup once its processes are gone (bounded wait)."""
    wait_for(lambda: _rmdir(path), 10, "cgroup %s to empty" % path)


def _rmdir(path):
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


class PostgresServer:
    """A real PostgreSQL server in a fresh directory, on 127.0.0.1 (and
    `also_on`, an address of this host that network namespaces reach) at a
    free port; as root it runs as the `postgres` user (PostgreSQL refuses
    root)."""

    def __init__(self, also_on=None):
        bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
        if not os.path.exists(os.path.join(bindir, "postgres")):
            bindir = "/usr/lib/postgresql/15/bin"
        self.dir = tempfile.mkdtemp(prefix="tgpg-")
        self.port = free_port()
        demote = None
        if os.geteuid() == 0:
            import pwd
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

            def demote():
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)
        log = open(os.path.join(self.dir, "server.log"), "ab")
        subprocess.run([os.path.join(bindir, "initdb"), "-D", self.dir + "/data", "-U", "trainguard", "-A", "trust",
                        "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"], stdout=log, stderr=log, check=True,
                       preexec_fn=demote)
        if also_on:  # clients from the namespaces' network, as from any host of a cluster
            with open(self.dir + "/data/pg_hba.conf", "a") as f:
                f.write("host all all %s/24 trust\n" % also_on)
        self._argv = [os.path.join(bindir, "postgres"), "-D", self.dir + "/data", "-p", str(self.port), "-k",
                      self.dir, "-c", "listen_addresses=127.0.0.1" + ("," + also_on if also_on else ""),
                      "-c", "fsync=off"]
        self._log, self._demote = log, demote
        self.proc = subprocess.Popen(self._argv, stdout=log, stderr=log, preexec_fn=demote)
        wait_for(lambda: self._ready(), 30, "the PostgreSQL test server")
        self.databases = 0

    def halt(self):
        """Stops the server (fast shutdown: clients are cut off), keeping its data."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)

    def resume(self):
        """Starts the halted server again on the same data and port."""
        self.proc = subprocess.Popen(self._argv, stdout=self._log, stderr=self._log, preexec_fn=self._demote)
        wait_for(lambda: self._ready(), 30, "the PostgreSQL test server, started again")

    def _ready(self):
        if self.proc.poll() is not None:
            with open(os.path.join(self.dir, "server.log")) as f:
                raise AssertionError("the PostgreSQL test server exited:\n" + f.read()[-2000:])
        return subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode == 0

    def url(self, database, host="127.0.0.1"):
        return "postgresql://trainguard@%s:%d/%s" % (host, self.port, database)

    def new_database(self):
        """An empty database of its own; its URL."""
        self.databases += 1
        name = "fleet%d" % self.databases
        subprocess.run(["psql", "-q", self.url("postgres"), "-c", "CREATE DATABASE %s" % name],
                       check=True, capture_output=True)
        return self.url(name)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)  # fast shutdown
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    server = PostgresServer()
    yield server
    server.stop()
