"""kvmm from Python: the KV-cache memory manager's C++ core through pybind11.

Layouts (KVLayout, LayerGroup, presets, read_hf_config), KVCacheManager (per request and
batch calls, CSR/dense page-table exports into numpy arrays without copies), Arena (host
or CUDA memory) and Buffer (package-owned int32 storage with DLPack). Errors raise
kvmm.Error with the C++ message. Guide: docs/python.md.
"""

from ._kvmm import *  # noqa: F401,F403
from ._kvmm import Error, KVCacheManager, NULL_PAGE, __version__, presets  # noqa: F401
from ._kvmm import _live_buffers, _live_managers  # noqa: F401  (leak tests)

__all__ = [n for n in dir() if not n.startswith("_")]
