# pytest setup for the kvmm Python package: imports it from the build tree named by
# KVMM_BUILD (default build/release; scripts/test.sh sets it), where CMake puts the package
# (python/kvmm) and the differential test's C++ driver (python/kvmm_py_driver; KVMM_PY_DRIVER
# names another build's, e.g. the ASan one).
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("KVMM_BUILD", ROOT / "build" / "release")).resolve()
sys.path.insert(0, str(BUILD / "python"))

import kvmm  # noqa: E402


@pytest.fixture
def driver_path():
    path = pathlib.Path(os.environ.get("KVMM_PY_DRIVER", BUILD / "python" / "kvmm_py_driver"))
    if not path.exists():
        pytest.fail(f"{path} not built (cmake --build {BUILD} --target kvmm_py_driver)")
    return path


def small_layout(tpp=4, window=8):
    """Full attention + sliding window, tiny pages: tables stay short, eviction comes early."""
    return kvmm.KVLayout.plan([
        kvmm.LayerGroup.full_attention("full", 2, 1, 64, 2, tpp),
        kvmm.LayerGroup.sliding_window("local", 2, 1, 64, 2, tpp, window),
    ])
