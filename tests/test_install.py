"""Issue 9, part 6: trainguard installs like the tools it replaces. `cmake
--install` and the Debian package (CPack) lay out the binary, the Python
module where Debian's python3 finds it, the rules, the headers and the
library; the installed `trainguard run` supervises the example job, and its
ranks find the module with no PYTHONPATH set by the user. The package is
unpacked into a scratch root (dpkg-deb -x), so the machine is left as it was."""

import glob
import os
import subprocess
import sys

from conftest import BUILD, EXAMPLE, PYTHON, events

PY = "python%d.%d" % sys.version_info[:2]


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)


def build_package(tmp_path):
    out = run(["cpack", "-G", "DEB", "-B", str(tmp_path / "pkg")], cwd=BUILD)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    debs = glob.glob(str(tmp_path / "pkg" / "trainguard_*.deb"))
    assert len(debs) == 1, debs
    return debs[0]


def test_the_package_is_stripped_and_its_debug_info_is_a_dbgsym_package_of_its_own(tmp_path):
    deb = build_package(tmp_path)
    ddebs = glob.glob(str(tmp_path / "pkg" / "trainguard-dbgsym_*.ddeb"))
    assert len(ddebs) == 1, os.listdir(str(tmp_path / "pkg"))
    debug = run(["dpkg-deb", "-c", ddebs[0]]).stdout
    assert "./usr/lib/debug/.build-id/" in debug and ".debug" in debug, debug[:2000]
    root = tmp_path / "root"
    assert run(["dpkg-deb", "-x", deb, str(root)]).returncode == 0
    for binary in [root / "usr" / "bin" / "trainguard", *root.glob("usr/lib/libtrainguard.so*")]:
        kind = run(["file", "-L", str(binary)]).stdout
        assert "ELF" in kind and "not stripped" not in kind, kind
    # The debug info is still there for gdb: the dbgsym package has a file per binary.
    assert debug.count(".debug\n") >= 2 or debug.count(".debug") >= 2, debug[:2000]
    print("package %.1f MB, dbgsym %.1f MB" % (os.path.getsize(deb) / 1e6, os.path.getsize(ddebs[0]) / 1e6))


def test_the_debian_package_holds_everything_and_its_trainguard_runs_the_example(tmp_path, no_leftovers):
    deb = build_package(tmp_path)
    listing = run(["dpkg-deb", "-c", deb]).stdout
    for path in ("./usr/bin/trainguard",
                 "./usr/lib/%s/dist-packages/trainguard/__init__.py" % PY,
                 "./usr/lib/trainguard/python/sitecustomize.py",
                 "./usr/lib/trainguard/python/trainguard/checkpoint.py",
                 "./usr/share/trainguard/rules/attribution.json",
                 "./usr/include/trainguard/client.h", "./usr/include/trainguard/c_api.h",
                 "./usr/lib/pkgconfig/trainguard.pc"):
        assert path in listing, path
    assert "_core.cpython-" in listing and "libtrainguard.so" in listing
    depends = run(["dpkg-deb", "-f", deb, "Depends"]).stdout
    assert "python3" in depends and "libgrpc++" in depends and "libsqlite3" in depends, depends
    # Debian's python3 looks where the package puts the module.
    assert "/usr/lib/%s/dist-packages" % PY in run([PYTHON, "-c", "import sys; print(sys.path)"]).stdout

    root = tmp_path / "root"
    assert run(["dpkg-deb", "-x", deb, str(root)]).returncode == 0
    trainguard = str(root / "usr" / "bin" / "trainguard")
    # The module imports from the package's dist-packages directory.
    dist = str(root / "usr" / "lib" / PY / "dist-packages")
    probe = run([PYTHON, "-c", "import sys; sys.path.insert(0, %r); import trainguard, trainguard._core; "
                 "print(trainguard.__file__)" % dist])
    assert probe.returncode == 0 and probe.stdout.startswith(dist), probe.stderr

    # Ranks of the installed trainguard find its module and sitecustomize
    # (not the build tree's), with no PYTHONPATH of the user's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = run([trainguard, "run", "--store", str(tmp_path / "p.db"), "--run-dir", str(tmp_path / "p"),
                 "--", PYTHON, "-c", "import trainguard, sitecustomize; print('AT', trainguard.__file__, "
                 "sitecustomize.__file__)"], env=env)
    assert where.returncode == 0, where.stderr[-2000:]
    line = [l for l in where.stdout.splitlines() if "AT " in l][0]
    assert line.split("AT ")[1].split() == [str(root / "usr/lib/trainguard/python/trainguard/__init__.py"),
                                            str(root / "usr/lib/trainguard/python/sitecustomize.py")]

    # The example job, supervised by the installed binary, with its shipped rules.
    store = str(tmp_path / "tg.db")
    done = run([trainguard, "run", "--nnodes", "1", "--nproc-per-node", "2", "--store", store,
                "--job-id", "installed", "--run-dir", str(tmp_path / "run"), "--",
                PYTHON, EXAMPLE, "--steps", "12", "--ckpt-dir", str(tmp_path / "ckpt")], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    kinds = [e["kind"] for e in events(store, "installed")]
    assert "first_step" in kinds and kinds[-1] == "job_succeeded", kinds
    bad_rules = run([trainguard, "attribute", "-"], input="CUDA out of memory. Tried to allocate 2 GiB\n")
    assert bad_rules.returncode == 0 and "oom" in bad_rules.stdout, bad_rules.stdout + bad_rules.stderr


def test_cmake_install_gives_cc_users_a_header_and_a_library(tmp_path):
    prefix = tmp_path / "usr"
    out = run(["cmake", "--install", BUILD, "--prefix", str(prefix)])
    assert out.returncode == 0, out.stderr[-2000:]
    src = tmp_path / "use.c"
    src.write_text('#include <trainguard/c_api.h>\n#include <stdio.h>\n'
                   'int main(void) { int attached = tg_init(); tg_step(1); tg_shutdown();\n'
                   '  printf("attached=%d\\n", attached); return 0; }\n')
    exe = tmp_path / "use"
    cc = run(["cc", "-I", str(prefix / "include"), str(src), "-L", str(prefix / "lib"), "-ltrainguard",
              "-o", str(exe)])
    assert cc.returncode == 0, cc.stderr
    ran = run([str(exe)], env=dict(os.environ, LD_LIBRARY_PATH=str(prefix / "lib")))
    assert ran.returncode == 0 and ran.stdout == "attached=0\n", ran.stdout + ran.stderr
    pc = (prefix / "lib" / "pkgconfig" / "trainguard.pc").read_text()
    assert "-ltrainguard" in pc
