// MemoryBackend: the few virtual-memory operations every kvmm memory component is
// built on (reserve a virtual range, create a physical chunk, map it at an address,
// set access for a contiguous run, unmap, release). Implemented by HostMemory (memfd,
// tested in CI), CudaMemory (CUDA VMM driver API) and FaultyMemory (tests). Every call
// is a system/driver call (microseconds): callers batch them off the per-token path.
#pragma once

#include <cstdint>

namespace kvmm {

// A physical chunk as the backend names it (memfd offset index, CUDA handle, ...).
using ChunkHandle = std::uint64_t;

// A reserved virtual range. `base` is a CPU pointer for HostMemory and a CUdeviceptr
// for CudaMemory; it is aligned to the backend's chunk size.
struct VirtualRange {
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;
};

// Acquiring calls (reserve, create_chunk, map, set_access) report a resource failure
// with `false` and change nothing; releasing calls (free_range, release_chunk, unmap)
// cannot fail for valid arguments and raise kvmm::Error only if the OS or driver
// breaks that promise. Misuse (unaligned address, unknown handle) raises kvmm::Error.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  MemoryBackend() = default;
  MemoryBackend(const MemoryBackend&) = delete;
  MemoryBackend& operator=(const MemoryBackend&) = delete;

  virtual const char* name() const = 0;
  // Smallest unit the backend can map (OS page; CUDA minimum granularity).
  virtual std::uint64_t granularity() const = 0;
  // Size of every chunk this backend creates: a multiple of granularity().
  virtual std::uint64_t chunk_bytes() const = 0;

  // Reserves `bytes` (rounded up to chunk_bytes()) of address space, chunk aligned,
  // with no access and no physical memory behind it.
  virtual bool reserve(std::uint64_t bytes, VirtualRange* out) = 0;
  // The range must have no chunk mapped in it any more.
  virtual void free_range(const VirtualRange& range) = 0;

  virtual bool create_chunk(ChunkHandle* out) = 0;
  // The chunk must be mapped nowhere.
  virtual void release_chunk(ChunkHandle chunk) = 0;

  // Maps `chunk` at `addr` (chunk aligned, inside a reserved range). No access yet:
  // call set_access for the run once all its chunks are mapped. A chunk may be mapped
  // at several addresses at once (aliasing).
  virtual bool map(ChunkHandle chunk, std::uint64_t addr) = 0;
  // Read/write access for a contiguous run of mapped chunks: one call per run.
  virtual bool set_access(std::uint64_t addr, std::uint64_t bytes) = 0;
  // Unmaps a contiguous run of mapped chunks; the address range stays reserved.
  virtual void unmap(std::uint64_t addr, std::uint64_t bytes) = 0;
};

}  // namespace kvmm
