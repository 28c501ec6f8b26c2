# Builds the kvmm extension with the project's CMake (target kvmm_python) and lets
# setuptools package it with kvmm/__init__.py. KVMM_PIP_BUILD_DIR names the CMake build
# folder (default: python/build-pip, reused between installs); KVMM_PIP_JOBS the -j. In pip's
# isolated build environment pybind11 comes from PyPI (pyproject.toml) and its CMake package
# is handed to CMake; without it (--no-build-isolation on Debian) CMake finds pybind11-dev.
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
        extra = []
        try:
            import pybind11

            extra.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        "-DKVMM_PYTHON=ON", f"-DPython_EXECUTABLE={sys.executable}", "-DKVMM_BUILD_TESTS=OFF",
                        "-DKVMM_BUILD_BENCH=OFF", "-DKVMM_BUILD_EXAMPLES=OFF", "-DKVMM_CUDA=OFF",
                        "-DKVMM_INSTALL=OFF", *extra], check=True)
        subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", "kvmm_python"], check=True)
        built = next((build / "python" / "kvmm").glob("_kvmm*.so"))
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, dest)


setup(packages=["kvmm", "kvmm.integrations"], ext_modules=[Extension("kvmm._kvmm", sources=[])], cmdclass={"build_ext": CMakeBuild})
