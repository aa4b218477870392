"""The ctypes structures of kvdock._capi mirror client.h exactly (and
kvdock._rows the kernel library's transfer, kernels.h): sizes and
field offsets compared with what the C compiler says (abi_dump.c, built by
CMake and passed as $KVDOCK_ABI_DUMP); the enums and constants the package
copies (kvdock/types.h, client.h) have the header's values; and the ABI
version agrees."""

from __future__ import annotations

import ctypes
import os
import subprocess
import unittest

from kvdock import _capi as C
from kvdock import _rows as R


def _mirror(name: str):
    """The package's copy of a structure or constant: libkvdock's in
    _capi, the kernel library's in _rows (named with a leading _)."""
    return getattr(R if name.startswith("_") else C, name)


class TestAbi(unittest.TestCase):
    def test_layouts_match_the_header(self):
        exe = os.environ.get("KVDOCK_ABI_DUMP")
        if not exe or not os.path.exists(exe):
            self.skipTest(f"KVDOCK_ABI_DUMP is not set to the abi_dump program ({exe!r})")
        out = subprocess.run([exe], check=True, stdout=subprocess.PIPE, text=True).stdout
        seen = 0
        for line in out.splitlines():
            if line.startswith("CONST "):
                _, name, value = line.split()
                self.assertEqual(_mirror(name), int(value), f"constant {name}")
                seen += 1
                continue
            key, value = line.split()
            if key == "ABI":
                self.assertEqual(int(value), C.CLIENT_ABI_VERSION, "KVD_CLIENT_ABI_VERSION")
                continue
            if key == "KERNELS_ABI":
                self.assertEqual(int(value), R.KERNELS_ABI_VERSION, "KVD_KERNELS_ABI_VERSION")
                continue
            if "." in key:
                struct, field = key.split(".")
                got = getattr(_mirror(struct), field).offset
                self.assertEqual(got, int(value), f"offset of {key}")
            else:
                self.assertEqual(ctypes.sizeof(_mirror(key)), int(value), f"sizeof {key}")
            seen += 1
        self.assertGreater(seen, 100)

    def test_library_exports_what_is_declared(self):
        lib = C.load()  # _declare() raises if a symbol is missing
        self.assertTrue(lib.kvd_err_name(6) == b"ESHAPE")
        for code, name in C.STATUS_NAMES.items():
            self.assertEqual(lib.kvd_err_name(code).decode(), name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
