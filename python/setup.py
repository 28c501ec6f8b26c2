# Builds the kvmm extension with the project's CMake (target kvmm_python) and lets
# setuptools package it with kvmm/__init__.py. KVMM_PIP_BUILD_DIR names the CMake build
# folder (default: python/build-pip, reused between installs); KVMM_PIP_JOBS the -j.
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(os.environ.get("KVMM_PIP_BUILD_DIR", HERE / "build-pip")).resolve()
        jobs = os.environ.get("KVMM_PIP_JOBS", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        "-DKVMM_PYTHON=ON", f"-DPython_EXECUTABLE={sys.executable}", "-DKVMM_BUILD_TESTS=OFF",
                        "-DKVMM_BUILD_BENCH=OFF", "-DKVMM_BUILD_EXAMPLES=OFF", "-DKVMM_CUDA=OFF",
                        "-DKVMM_INSTALL=OFF"], check=True)
        subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", "kvmm_python"], check=True)
        built = next((build / "python" / "kvmm").glob("_kvmm*.so"))
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, dest)


setup(packages=["kvmm"], ext_modules=[Extension("kvmm._kvmm", sources=[])], cmdclass={"build_ext": CMakeBuild})
