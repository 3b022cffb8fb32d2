"""`pip install --no-build-isolation .` (offline): loco's Python package, its extension built with
CMake from this checkout (docs/python.md): only the methods' library and the extension
(-DLOCO_ENGINE=OFF), so it needs CMake, g++, pybind11, Open MPI, hiredis, libsodium, toml++ and
nlohmann-json, and none of the CPU engine's libraries."""
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build = os.path.join(HERE, "build-python")
        subprocess.check_call(["cmake", "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DLOCO_ENGINE=OFF"])
        subprocess.check_call(["cmake", "--build", build, "--target", "loco_python", "-j", str(os.cpu_count() or 1)])
        out = os.path.join(build, "python", "loco")
        for name in os.listdir(out):
            if name.startswith("_loco") and name.endswith(".so"):
                shutil.copy2(os.path.join(out, name), os.path.join(self.build_lib, "loco", name))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # the wheel holds a compiled extension


setup(name="loco", version="0.1", description="Low-communication training methods (loco) for PyTorch loops",
      packages=["loco"], package_dir={"": "python"}, cmdclass={"build_py": BuildWithCMake},
      distclass=BinaryDistribution, python_requires=">=3.9")
