"""A real Slurm cluster on this machine, for tests: Debian's slurmctld and one
slurmd per node, each node in network, UTS, PID and mount namespaces of its
own (its own address behind one bridge, its own host name, its own process
tree and /proc), authenticated by a munged of its own. Nothing outside the
cluster's directory changes: the configuration, state, spools, logs and the
munge socket live there, and every command gets SLURM_CONF.

    python3 tests/slurm_cluster.py 3     # start 3 nodes, print how to use them, Enter stops

Needs root (namespaces) and slurmctld, slurmd, slurm-client and munge."""

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

SLURM_BINARIES = ("slurmctld", "slurmd", "sinfo", "scontrol", "sbatch", "srun", "munged")


def available():
    """'' when a cluster can be started here, else why not."""
    if os.geteuid() != 0:
        return "needs root for namespaces"
    missing = [b for b in SLURM_BINARIES if not shutil.which(b)]
    if missing:
        return "missing " + ", ".join(missing) + " (scripts/install-deps.sh installs them)"
    return ""


def _free_port():
    from conftest import free_port  # below the ephemeral ports, in this worker's block
    return free_port()


def _run(*argv, check=True):
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


class SlurmCluster:
    def __init__(self, nodes, directory, cpus=2, prolog=None):
        self.dir = os.path.abspath(str(directory))
        self.tag = uuid.uuid4().hex[:6]
        # 10.150-199.x: apart from `run --netns` (10.200-249.x), whose bridge is
        # on this host too when the two run at once.
        self.subnet = "10.%d.%d" % (150 + int(self.tag[:2], 16) % 50, int(self.tag[2:4], 16))
        self.gateway = self.subnet + ".254"
        self.bridge = "tgsb" + self.tag
        self.names = ["sn%d" % i for i in range(1, nodes + 1)]
        self.cpus = cpus
        self.prolog = prolog  # a script every node runs as root when a job is allocated it
        self.procs = {}  # name -> Popen of the namespace's first process
        self.munged = None
        self.ctld = None
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    # ------------------------------------------------------------------
    def address(self, name):
        return "%s.%d" % (self.subnet, self.names.index(name) + 1)

    def netns(self, name):
        return "tgs-%s-%s" % (self.tag, name)

    def start(self, timeout=30):
        os.makedirs(self.dir, exist_ok=True)
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        try:
            self._network()
            self._munge()
            self._write_conf()
            self._hosts()
            self.ctld = self._in_namespaces(None, "ctl", ["slurmctld", "-D", "-i", "-f", self.conf])
            for name in self.names:
                self.start_node(name)
            self.wait_idle(self.names, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self):
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", self.gateway + "/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, name in enumerate(self.names, 1):
            ns = self.netns(name)
            host_side, node_side = "tgsv%s%d" % (self.tag, i), "tgsp%s%d" % (self.tag, i)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", host_side, "type", "veth", "peer", "name", node_side)
            _run("ip", "link", "set", node_side, "netns", ns)
            _run("ip", "link", "set", host_side, "master", self.bridge)
            _run("ip", "link", "set", host_side, "up")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", self.address(name) + "/24", "dev", node_side)
            _run("ip", "netns", "exec", ns, "ip", "link", "set", node_side, "up")
            _run("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", self.gateway)

    def _munge(self):
        munge = pwd.getpwnam("munge")
        # A directory of its own under /tmp: the munge user must reach it (a
        # test's directory is root's alone), and socket paths must be short.
        d = self.munge_dir = tempfile.mkdtemp(prefix="tgmunge-")
        os.chown(d, munge.pw_uid, munge.pw_gid)
        os.chmod(d, 0o755)  # munged wants every client able to reach its socket
        self.munge_socket = os.path.join(d, "munge.socket")

        def as_munge():
            os.setgid(munge.pw_gid)
            os.setuid(munge.pw_uid)
        self.munged = subprocess.Popen(
            ["munged", "--foreground", "--socket", self.munge_socket, "--pid-file", d + "/munged.pid",
             "--log-file", d + "/munged.log", "--seed-file", d + "/munged.seed", "--key-file",
             "/etc/munge/munge.key", "--num-threads", "4"],
            preexec_fn=as_munge, stdout=subprocess.DEVNULL, stderr=open(d + "/munged.err", "w"))
        deadline = time.monotonic() + 10
        while not os.path.exists(self.munge_socket):
            if self.munged.poll() is not None or time.monotonic() > deadline:
                with open(d + "/munged.err") as f:
                    raise RuntimeError("munged did not start: " + f.read())
            time.sleep(0.05)

    def _write_conf(self):
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        d = self.dir
        lines = [
            "ClusterName=tg%s" % self.tag,
            "SlurmctldHost=ctl(%s)" % self.gateway,
            "SlurmctldPort=%d" % self.ctld_port,
            "SlurmdPort=%d" % self.slurmd_port,
            "AuthType=auth/munge",
            "AuthInfo=socket=%s" % self.munge_socket,
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            "StateSaveLocation=%s/state" % d,
            "SlurmdSpoolDir=%s/spool/%%n" % d,
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd.%%n.pid" % d,
            "SlurmctldLogFile=%s/slurmctld.log" % d,
            "SlurmdLogFile=%s/slurmd.%%n.log" % d,
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/linear",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdTimeout=5",
            "SlurmctldTimeout=10",
            "MessageTimeout=5",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=300",
            "PlugStackConfig=%s/plugstack.conf" % d,
        ]
        if self.prolog:
            lines += ["Prolog=%s" % self.prolog, "PrologFlags=Alloc"]
        for name in self.names:
            lines.append("NodeName=%s NodeAddr=%s CPUs=%d Boards=1 SocketsPerBoard=1 CoresPerSocket=%d "
                         "ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN" %
                         (name, self.address(name), self.cpus, self.cpus))
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        open(os.path.join(d, "plugstack.conf"), "w").close()

    def _hosts(self):
        """An /etc/hosts for the cluster, bind-mounted over the real one in
        each node's own mount namespace."""
        self.hosts = os.path.join(self.dir, "hosts")
        with open(self.hosts, "w") as f:
            f.write("127.0.0.1 localhost\n%s ctl\n" % self.gateway)
            for name in self.names:
                f.write("%s %s\n" % (self.address(name), name))

    def _in_namespaces(self, netns, hostname, argv):
        """`argv` as the first process of new UTS, PID and mount namespaces
        (and in `netns`, if given), with the cluster's /etc/hosts."""
        script = ("mount --bind %s /etc/hosts && hostname %s && exec %s" %
                  (self.hosts, hostname, " ".join(argv)))
        cmd = ["unshare", "--uts", "--pid", "--mount", "--mount-proc", "--fork", "--kill-child",
               "sh", "-c", script]
        if netns:
            # nsenter, not `ip netns exec`: that one remounts /sys, and slurmd
            # wants the host's /sys/fs/cgroup.
            cmd = ["nsenter", "--net=/run/netns/" + netns] + cmd
        log = open(os.path.join(self.dir, "%s.out" % hostname), "ab")
        return subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env, start_new_session=True)

    def start_node(self, name):
        os.makedirs(os.path.join(self.dir, "spool", name), exist_ok=True)
        self.procs[name] = self._in_namespaces(self.netns(name), name, ["slurmd", "-D", "-N", name, "-f", self.conf])

    def power_cut(self, name):
        """Every process of the node dies at once (SIGKILL to its PID namespace)."""
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    # ------------------------------------------------------------------
    def command(self, *argv, check=True, timeout=30, cwd=None):
        done = subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=timeout, cwd=cwd)
        if check and done.returncode != 0:
            raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), done.returncode, done.stderr))
        return done

    def node_states(self):
        out = self.command("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def node_reasons(self):
        """`sinfo -R`: node -> reason, for nodes that have one."""
        out = self.command("sinfo", "-h", "-R", "-o", "%N|%E").stdout
        reasons = {}
        for line in out.splitlines():
            if "|" in line:
                nodes, reason = line.split("|", 1)
                for n in self.command("scontrol", "show", "hostnames", nodes).stdout.split():
                    reasons[n] = reason
        return reasons

    def wait_idle(self, names, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                states = self.node_states()
            except (RuntimeError, subprocess.TimeoutExpired):
                states = {}
            if all(states.get(n) == "idle" for n in names):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("nodes not idle within %d s: %s\n%s" % (timeout, states, self.logs()))
            time.sleep(0.2)

    def logs(self, tail=1500):
        out = []
        for fn in sorted(os.listdir(self.dir)):
            if fn.endswith(".log") or fn.endswith(".out") or fn.startswith("slurm-"):
                with open(os.path.join(self.dir, fn), errors="replace") as f:
                    out.append("== %s ==\n%s" % (fn, f.read()[-tail:]))
        return "\n".join(out)

    def stop(self):
        for name in list(self.procs):
            self.power_cut(name)
        if self.ctld is not None:
            os.killpg(self.ctld.pid, signal.SIGKILL)
            self.ctld.wait()
            self.ctld = None
        if self.munged is not None:
            self.munged.terminate()
            try:
                self.munged.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.munged.kill()
                self.munged.wait()
            self.munged = None
        if getattr(self, "munge_dir", None):
            shutil.rmtree(self.munge_dir, ignore_errors=True)
        for name in self.names:
            _run("ip", "netns", "del", self.netns(name), check=False)
        _run("ip", "link", "del", self.bridge, check=False)


if __name__ == "__main__":
    why = available()
    if why:
        sys.exit("cannot start a Slurm cluster: " + why)
    cluster = SlurmCluster(int(sys.argv[1]) if len(sys.argv) > 1 else 3, "/tmp/slurm-cluster-%d" % os.getpid())
    t0 = time.monotonic()
    cluster.start()
    print("%d nodes up in %.1f s; export SLURM_CONF=%s" % (len(cluster.names), time.monotonic() - t0, cluster.conf))
    try:
        input("Enter stops the cluster\n")
    finally:
        cluster.stop()
