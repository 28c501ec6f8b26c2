// Shared parts of the kvmm Python module (_kvmm): the C++-owned int32 Buffer that page
// tables are exported into (buffer protocol + DLPack, zero copy), the DLPack capsule
// maker, and the per-unit bind functions. Exporting a view is O(1); nothing is copied.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/backend.hpp"
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/kv_arena.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace kvmm::py_bind {

namespace py = pybind11;

// DLPack's device types used here (dlpack.h: kDLCPU = 1, kDLCUDA = 2).
inline constexpr std::int32_t kDLCpu = 1;
inline constexpr std::int32_t kDLCuda = 2;
// DLPack's type codes (kDLInt = 0, kDLUInt = 1).
inline constexpr std::uint8_t kDLInt = 0;
inline constexpr std::uint8_t kDLUInt = 1;

// A DLPack capsule ("dltensor") of a C-contiguous tensor at `data`; `owner` is kept alive
// until the consumer (torch.from_dlpack, numpy.from_dlpack) calls the deleter.
py::capsule make_dlpack(py::handle owner, void* data, std::int32_t device_type, std::int32_t device_id,
                        std::uint8_t code, std::uint8_t bits, const std::vector<std::int64_t>& shape);

// int32 storage owned by the package: a page-table export's indptr, indices, ... . It never
// grows in place (a bigger export makes a new Buffer), so a numpy view of it stays valid
// for as long as the view lives.
struct Buffer {
  std::vector<std::int32_t> data;
  std::vector<py::ssize_t> shape;
  explicit Buffer(std::vector<py::ssize_t> s);
  Buffer(Buffer&& o) noexcept : data(std::move(o.data)), shape(std::move(o.shape)) { ++live; }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer& operator=(Buffer&&) = delete;
  ~Buffer() { --live; }
  py::ssize_t size() const { return static_cast<py::ssize_t>(data.size()); }
  static inline std::int64_t live = 0;  // Buffers alive, for leak tests (under the GIL)
};

// A zero-copy numpy view of the whole buffer (its base is the Buffer) and of its first n
// elements (1-D only).
py::array view_of(const py::object& buffer);
py::array view_prefix(const py::object& buffer, py::ssize_t n);

// A writable, C-contiguous int32 buffer of at least `min_size` elements given by the
// caller (numpy array, array.array('i'), a Buffer, ...), or TypeError / kvmm.Error naming
// `what`. The returned span stays valid while `obj` is referenced.
struct Int32Out {
  py::buffer_info info;
  std::int32_t* data = nullptr;
  std::size_t size = 0;
};
Int32Out int32_out(const py::handle& obj, const char* what);

// The memory a Python engine's kernels read: a KVArena over host memory or CUDA VMM, its
// chunk pool and backend, and the ArenaPagePool a KVCacheManager draws large pages from
// (KVCacheManager(..., arena=...)). Members in construction order, destroyed in reverse.
struct Arena {
  std::unique_ptr<MemoryBackend> backend;
  std::unique_ptr<ChunkPool> pool;
  std::unique_ptr<KVArena> arena;
  std::unique_ptr<ArenaPagePool> pages;
  bool cuda = false;
  int device = 0;
  bool in_use = false;  // a manager draws from it (one at a time)
};

void bind_spec(py::module_& m);
void bind_buffer(py::module_& m);
void bind_memory(py::module_& m);
void bind_manager(py::module_& m);

}  // namespace kvmm::py_bind
