// CudaMemory: the backend on the CUDA VMM driver API (cuMemAddressReserve/Create/Map/
// SetAccess/Unmap/Release), resolved at run time from libcuda.so.1 (never linked): with
// no driver available() is false and construction raises kvmm::Error. POSIX-fd
// shareable chunks; unmaps can wait for an event on the consuming stream. Each call is
// one driver call (tens of µs for map/set-access/unmap, vAttention Table 3).
#pragma once

#include "kvmm/memory/backend.hpp"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kvmm {

struct CudaMemoryOptions {
  int device = 0;
  // Chunk size: at least 2 MiB and a multiple of the device's allocation granularity.
  std::uint64_t chunk_bytes = std::uint64_t{2} << 20;
  // Request the POSIX file descriptor handle type, so export_chunk() works.
  bool shareable = true;
};

class CudaMemory final : public MemoryBackend {
 public:
  // True when libcuda.so.1 loads, every needed entry point resolves, cuInit succeeds
  // and at least one device exists. Never throws; cheap after the first call.
  static bool available();
  // Why available() is false ("" when it is true).
  static std::string unavailable_reason();

  // Raises kvmm::Error (with unavailable_reason()) when the driver is unavailable, and
  // for a chunk size below 2 MiB or not a multiple of the granularity.
  explicit CudaMemory(const CudaMemoryOptions& options = {});
  // Completes pending unmaps and releases the primary context.
  ~CudaMemory() override;

  const char* name() const override { return "cuda"; }
  std::uint64_t granularity() const override { return granularity_; }
  std::uint64_t chunk_bytes() const override { return chunk_bytes_; }

  bool reserve(std::uint64_t bytes, VirtualRange* out) override;
  void free_range(const VirtualRange& range) override;
  bool create_chunk(ChunkHandle* out) override;
  void release_chunk(ChunkHandle chunk) override;
  bool map(ChunkHandle chunk, std::uint64_t addr) override;
  bool set_access(std::uint64_t addr, std::uint64_t bytes) override;
  void unmap(std::uint64_t addr, std::uint64_t bytes) override;

  // Later unmap() calls are deferred until the work queued on `stream` (a CUstream,
  // nullptr for the legacy default stream) at the time of the call has completed.
  void set_consumer_stream(void* stream);
  void clear_consumer_stream();
  // Runs the deferred unmaps whose events have completed; returns how many ran.
  std::size_t poll();
  // Waits for every deferred unmap and runs it.
  void drain();
  std::size_t pending_unmaps() const {
    std::lock_guard lock(mutex_);
    return pending_.size();
  }

  // Exports a chunk as a POSIX file descriptor (the caller owns and closes it) and
  // imports one exported by another process; the imported chunk is released with
  // release_chunk() like any other.
  int export_chunk(ChunkHandle chunk);
  ChunkHandle import_chunk(int fd);

 private:
  struct Pending {
    std::uint64_t addr;
    std::uint64_t bytes;
    void* event;
  };
  void make_current() const;
  void complete(std::size_t i);  // waits for pending_[i], unmaps, erases it
  int device_ = 0;
  void* context_ = nullptr;
  bool shareable_ = true;
  std::uint64_t granularity_ = 0;
  std::uint64_t chunk_bytes_ = 0;
  void* stream_ = nullptr;
  bool deferred_ = false;
  std::vector<Pending> pending_;
  std::vector<void*> spare_events_;
  mutable std::recursive_mutex mutex_;  // poll()/drain() may run beside pool calls
};

}  // namespace kvmm
