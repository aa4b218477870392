"""The kvdock wheel carries libkvdock.so and libkvdock_kernels.so (for
kvdock.copy_rows), so that `pip install` gives a working package.

Each library comes from, in order: $KVDOCK_LIB / $KVDOCK_KERNELS_LIB (a
built one); the repository's build tree (build/, build-cpu/, build-gpu/
beside client/, as deploy/build.sh leaves it); else CMake builds it here
(its target alone, with the Debian packages deploy/setup.sh installs).
They go into the package as libkvdock.so.<client ABI> and
libkvdock_kernels.so.<kernels ABI>, where the package looks first, and the
wheel is tagged for the platform (the code is pure Python over ctypes:
py3-none-<platform>).  The rest of the metadata is in pyproject.toml.
"""

import glob
import os
import re
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def client_abi():
    with open(os.path.join(HERE, "kvdock", "_capi.py")) as f:
        return int(re.search(r"^CLIENT_ABI_VERSION = (\d+)", f.read(), re.M).group(1))


def kernels_abi():
    with open(os.path.join(HERE, "kvdock", "_rows.py")) as f:
        return int(re.search(r"^KERNELS_ABI_VERSION = (\d+)", f.read(), re.M).group(1))


# (environment variable, folder of the build tree, CMake target) per library
LIBRARIES = {
    "libkvdock.so": ("KVDOCK_LIB", "client", "kvdock_client_shared"),
    "libkvdock_kernels.so": ("KVDOCK_KERNELS_LIB", "kernels", "kvdock_kernels_shared"),
}


def find_library(name, abi):
    var, folder, target = LIBRARIES[name]
    env = os.environ.get(var)
    if env:
        if not os.path.exists(env):
            raise SystemExit(f"{var}={env} does not exist")
        return os.path.realpath(env)
    for build in ("build", "build-cpu", "build-gpu"):
        cand = os.path.join(REPO, build, folder, f"{name}.{abi}")
        if os.path.exists(cand):
            return os.path.realpath(cand)
    if not os.path.exists(os.path.join(REPO, "CMakeLists.txt")):
        raise SystemExit(f"kvdock: no {name} to put in the wheel: set {var} to a built "
                         "one, or install from the kvdock repository (client/python)")
    tmp = tempfile.mkdtemp(prefix="kvdock-wheel-")
    subprocess.check_call(["cmake", "-S", REPO, "-B", tmp, "-DCMAKE_BUILD_TYPE=Release"])
    subprocess.check_call(["cmake", "--build", tmp, "--target", target, "-j",
                           str(os.cpu_count() or 1)])
    found = glob.glob(os.path.join(tmp, folder, f"{name}.{abi}"))
    if not found:
        raise SystemExit(f"kvdock: CMake built no {name}.{abi} in {tmp}")
    return os.path.realpath(found[0])


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        for name, abi in (("libkvdock.so", client_abi()), ("libkvdock_kernels.so", kernels_abi())):
            lib = find_library(name, abi)
            dst = os.path.join(self.build_lib, "kvdock", f"{name}.{abi}")
            self.announce(f"kvdock: bundling {lib} as {dst}", level=2)
            shutil.copyfile(lib, dst)
            os.chmod(dst, 0o755)


cmdclass = {"build_py": BuildWithLibrary}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """A wheel for this platform (it holds a shared library), any Python 3."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: pip builds through setuptools' own
    pass

setup(cmdclass=cmdclass)
