"""The kvdock Python client where numpy is not installed, as on the GPU
machine (PyTorch and Triton, no numpy).  Each check runs in a subprocess in
which `import numpy` fails (sys.modules["numpy"] = None before anything is
imported; PyTorch warns that it cannot initialise NumPy and works on):

- `import kvdock`, and the bytes paths with neither numpy nor PyTorch:
  operands as bytes, bytearray, array.array, ctypes arrays; indices as
  lists; host pools read through memoryview; numpy views refused with an
  ImportError that says what to use instead;
- test_torch_cpu.py, the client's PyTorch paths on the cpu backend, whole:
  it must pass, and only a test that compares numpy views may skip;
- test_gpu.py imports (its GPU checks need a GPU: the GPU machine runs them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import unittest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
D: harness.Daemon = None  # type: ignore[assignment]


def setUpModule() -> None:
    global D
    D = harness.Daemon("cpu")


def tearDownModule() -> None:
    if D is not None:
        D.stop_clean()


def blocked_prelude(mods) -> str:
    return "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in mods)


class TestWithoutNumpy(unittest.TestCase):
    def run_py(self, argv, timeout: float = 240):
        env = dict(os.environ)
        env["KVDOCK_SOCKET"] = D.socket
        p = subprocess.run([sys.executable] + argv, cwd=HERE, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return p.returncode, p.stdout

    def run_script(self, code: str, block=("numpy",)) -> str:
        rc, out = self.run_py(["-c", blocked_prelude(block) + textwrap.dedent(code)])
        if rc != 0:
            self.fail(f"the script with {', '.join(block)} blocked exited {rc}:\n{out}")
        return out

    def test_import_without_numpy(self):
        out = self.run_script("""
            import kvdock
            from kvdock import _util
            assert _util.np is None, _util.np
            assert sys.modules.get("numpy") is None
            print("kvdock", kvdock.__version__, "imports without numpy")
        """)
        self.assertIn("imports without numpy", out)

    def test_bytes_paths_without_numpy_or_torch(self):
        out = self.run_script("""
            import array, ctypes, kvdock
            with kvdock.Client(name="no-numpy-bytes", timeout=30) as c:
                a = c.create_pool("nn-a", 2, 16, 8)
                b = c.create_pool("nn-b", 2, 16, 8)
                ma, mb = a.map(), b.map()
                L = a.info.layer_stride
                def row(m, layer, slot, v=False):
                    off = layer * L + (a.info.v_offset if v else 0) + slot * a.info.slot_stride
                    return bytes(m.memoryview()[off:off + 8])
                c.store(a, 0, [3], b"K" * 8, bytearray(b"V" * 8))
                c.store(a, 1, [5, -1], array.array("i", [1, 2, 3, 4]),
                        (ctypes.c_uint8 * 16)(*range(16)))
                assert row(ma, 0, 3) == b"K" * 8 and row(ma, 0, 3, True) == b"V" * 8
                assert row(ma, 1, 5) == array.array("i", [1, 2]).tobytes()
                assert row(ma, 1, 5, True) == bytes(range(8))
                c.transfer(a, b, [3, 5], [0, 1])
                assert row(mb, 0, 0) == b"K" * 8 and row(mb, 1, 1, True) == bytes(range(8))
                f8 = c.create_pool("nn-f8", 1, 4, 2 * 4)
                kf = array.array("f", [0.5] * 8)
                r = c.fp8_set(f8, 0, [1], kf, kf, num_heads=2, head_dim=4, src_dtype="float32")
                assert r.rows == 1, r
                try:
                    ma.k(0)
                    raise AssertionError("numpy views without numpy")
                except ImportError as e:
                    assert "k_tensor" in str(e), e
                try:
                    c.store(a, 0, [1.5], b"x" * 8, b"y" * 8)
                    raise AssertionError("float indices accepted")
                except TypeError as e:
                    assert "integers" in str(e), e
                print("bytes paths ok without numpy or torch")
        """, block=("numpy", "torch"))
        self.assertIn("bytes paths ok", out)

    def test_torch_cpu_suite_without_numpy(self):
        torch = harness.torch_or_none()
        if torch is None:
            self.skipTest("PyTorch is not importable (apt-get install python3-torch)")
        rc, out = self.run_py([os.path.join(HERE, "run_suite.py"), "--block", "numpy",
                               "test_torch_cpu"])
        # quoted: the inner suite's expected "SKIP:" line is not this test's
        print("\n" + "\n".join("  | " + line for line in out.splitlines()[-4:]))
        self.assertEqual(rc, 0, f"test_torch_cpu with numpy blocked exited {rc}:\n{out}")
        m = re.search(r"test_torch_cpu: (\d+) passed, (\d+) failed, (\d+) skipped", out)
        self.assertIsNotNone(m, out)
        skips = re.findall(r"^SKIP: (\w+) ", out, re.M)
        self.assertEqual(skips, ["test_numpy_and_tensor_views_agree"],
                         f"only the numpy comparison may skip without numpy:\n{out}")
        self.assertGreaterEqual(int(m.group(1)), 10, out)

    def test_gpu_suite_imports_without_numpy(self):
        out = self.run_script("""
            import test_gpu
            print("test_gpu imports without numpy; on this machine:",
                  test_gpu._why_no_gpu() or "a usable GPU")
        """)
        print("\n" + out.strip().splitlines()[-1])
        self.assertIn("test_gpu imports without numpy", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
