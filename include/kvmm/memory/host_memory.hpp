// HostMemory: the memory backend on plain Linux virtual memory, so that every memory
// component runs on real memory without a GPU. Physical chunks live at offsets of one
// memfd; map() is mmap(MAP_FIXED|MAP_SHARED) of a chunk into a PROT_NONE reservation,
// set_access() one mprotect per run, unmap() maps PROT_NONE back, release_chunk()
// punches a hole (fallocate) and the offset is reused. Each call is one syscall (~µs)
// plus an O(log ranges) check that the address lies in a range this backend reserved.
#pragma once

#include "kvmm/memory/backend.hpp"

#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

namespace kvmm {

struct HostMemoryOptions {
  // Chunk size; rounded up to a multiple of the OS page size. 2 MiB like CUDA.
  std::uint64_t chunk_bytes = std::uint64_t{2} << 20;
  // Physical capacity in chunks: create_chunk returns false beyond it (models a GPU
  // that is full). 0 means unlimited.
  std::uint32_t max_chunks = 0;
};

class HostMemory final : public MemoryBackend {
 public:
  explicit HostMemory(const HostMemoryOptions& options = {});
  ~HostMemory() override;

  const char* name() const override { return "host"; }
  std::uint64_t granularity() const override { return page_bytes_; }
  std::uint64_t chunk_bytes() const override { return chunk_bytes_; }

  bool reserve(std::uint64_t bytes, VirtualRange* out) override;
  void free_range(const VirtualRange& range) override;
  bool create_chunk(ChunkHandle* out) override;
  void release_chunk(ChunkHandle chunk) override;
  bool map(ChunkHandle chunk, std::uint64_t addr) override;
  bool set_access(std::uint64_t addr, std::uint64_t bytes) override;
  void unmap(std::uint64_t addr, std::uint64_t bytes) override;

  // Accounting for tests: chunks created and not released, chunk mappings alive,
  // ranges reserved and not freed.
  std::uint32_t live_chunks() const { return live_chunks_; }
  std::uint64_t live_mappings() const { return live_mappings_; }
  std::uint32_t live_ranges() const { return static_cast<std::uint32_t>(ranges_.size()); }
  // Number of times chunk `c` is mapped right now.
  std::uint32_t map_count(ChunkHandle chunk) const;
  // Raises kvmm::Error naming the first broken invariant (counters against the chunk and
  // mapping tables, every mapping inside a reserved range). O(chunks + mappings).
  void check_invariants() const;

 private:
  void check_chunk(ChunkHandle chunk, const char* what) const;
  // Raises unless [addr, addr + bytes) is a run of whole chunks inside one reserved range.
  void check_run(std::uint64_t addr, std::uint64_t bytes) const;
  int fd_ = -1;
  std::uint64_t page_bytes_ = 0;
  std::uint64_t chunk_bytes_ = 0;
  std::uint32_t max_chunks_ = 0;
  std::uint64_t file_chunks_ = 0;                            // memfd size in chunks
  std::vector<std::uint32_t> map_count_;                     // per offset index: live mappings, or kDead
  std::vector<std::uint32_t> free_slots_;                    // released offset indices, reused first
  std::unordered_map<std::uint64_t, std::uint32_t> mapped_;  // address -> offset index
  std::map<std::uint64_t, std::uint64_t> ranges_;            // reserved: base -> bytes
  std::uint32_t live_chunks_ = 0;
  std::uint64_t live_mappings_ = 0;
};

}  // namespace kvmm
