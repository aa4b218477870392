"""`pip install` of client/python gives a working package: the wheel
carries libkvdock.so and libkvdock_kernels.so (a platform wheel), and the
installed package (not the source tree), with no $KVDOCK_LIB,
$KVDOCK_KERNELS_LIB or PYTHONPATH, loads its own copies, runs the README's
example against kvdockd and copies rows with kvdock.copy_rows.  The package is built from a copy
of the source (no build/ or egg-info left in the tree; the library to
bundle named by $KVDOCK_LIB at build time, as the copy has no repository
around it), into a fresh virtual environment that sees the system's numpy,
without build isolation (the CI machine reaches no Python package index:
pip uses the system's setuptools)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import harness

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python")


class TestPipInstall(unittest.TestCase):
    def setUp(self) -> None:
        for mod in ("venv", "ensurepip"):
            try:
                __import__(mod)
            except ImportError:
                self.skipTest(f"python3 has no {mod} module (apt-get install python3-venv)")
        import importlib.util

        if importlib.util.find_spec("setuptools") is None:
            self.skipTest("python3 has no setuptools (apt-get install python3-setuptools)")
        self.tmp = tempfile.mkdtemp(prefix="kvdock-pip-")
        self.daemon = harness.Daemon("cpu")

    def tearDown(self) -> None:
        self.daemon.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_cmd(self, argv, env=None) -> str:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, timeout=240)
        if p.returncode != 0:
            self.fail(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout}")
        return p.stdout

    def test_pip_install_and_use(self):
        src = os.path.join(self.tmp, "src")
        shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                "__pycache__"))
        venv = os.path.join(self.tmp, "venv")
        self.run_cmd([sys.executable, "-m", "venv", "--system-site-packages", venv])
        py = os.path.join(venv, "bin", "python")
        lib = os.environ.get("KVDOCK_LIB")
        kernels = os.environ.get("KVDOCK_KERNELS_LIB")
        if not lib or not kernels:
            self.skipTest("KVDOCK_LIB and KVDOCK_KERNELS_LIB are not set to the built libraries")
        out = self.run_cmd([py, "-m", "pip", "install", "-v", "--no-build-isolation",
                            "--no-deps", "--no-index", src],
                           env=dict(os.environ, KVDOCK_LIB=lib, KVDOCK_KERNELS_LIB=kernels))
        self.assertIn("Successfully installed kvdock", out)
        self.assertRegex(out, r"kvdock-[0-9.]+-py3-none-linux_\w+\.whl",
                         "not a platform wheel")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "KVDOCK_LIB", "KVDOCK_KERNELS_LIB")}
        env["KVDOCK_SOCKET"] = self.daemon.socket
        script = textwrap.dedent("""
            import os, sys, kvdock
            assert os.path.realpath(kvdock.__file__).startswith(os.path.realpath(sys.prefix)), \
                kvdock.__file__
            assert "KVDOCK_LIB" not in os.environ
            with kvdock.Client(name="pip-installed") as c:   # socket from $KVDOCK_SOCKET
                p = c.create_pool("pip-pool", 1, 8, 16)
                c.store(p, 0, [3], b"k" * 16, b"v" * 16)
                m = p.map()
                assert bytes(m.k(0)[3]) == b"k" * 16 and bytes(m.v(0)[3]) == b"v" * 16
                import numpy as np
                src, out = np.arange(64, dtype=np.uint8).reshape(4, 16), np.zeros((4, 16), np.uint8)
                kvdock.copy_rows(src, out, [3, 1], [0, 2])
                assert (out[0] == src[3]).all() and (out[2] == src[1]).all()
                from kvdock import _rows
                print("installed kvdock", kvdock.__version__, "ok via", kvdock.library_path(),
                      _rows.kernels_library()._name)
        """)
        out = self.run_cmd([py, "-c", script], env=env)
        self.assertIn("ok via", out)
        # the libraries it loaded are the wheel's, inside the environment
        for via in out.split("ok via", 1)[1].split():
            self.assertTrue(os.path.realpath(via).startswith(os.path.realpath(venv)), via)


if __name__ == "__main__":
    unittest.main(verbosity=2)
