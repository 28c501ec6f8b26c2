// ActivationAllocator: eLLM's activation eTensor pool: best fit with coalescing over its
// own virtual range, in whole chunks mapped from the shared ChunkPool on first use and
// kept mapped after free (reuse costs no backend call); gc() unmaps idle chunks for KV.
// allocate/free: O(log extents) + one ChunkPool transaction for new chunks; gc: O(range
// chunks). Not thread-safe.
#pragma once

#include "kvmm/memory/chunk_pool.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvmm {

class ActivationAllocator {
 public:
  // Reserves `max_bytes` (rounded up to whole chunks) of address space.
  ActivationAllocator(ChunkPool& pool, std::uint64_t max_bytes);
  ~ActivationAllocator();
  ActivationAllocator(const ActivationAllocator&) = delete;
  ActivationAllocator& operator=(const ActivationAllocator&) = delete;

  // Address of `bytes` (rounded up to whole chunks) of mapped, writable memory;
  // nullopt, with nothing changed, when no extent fits (any size past the range, up to
  // 2^64-1) or the pool is short. A backend exception propagates, nothing changed.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);
  // Raises kvmm::Error for an address that is not a live allocation.
  void free(std::uint64_t addr);
  // Unmaps up to `n` idle chunks (mapped, under no allocation); returns how many. Should
  // the backend raise, the chunks unmapped before are accounted and it propagates.
  std::uint32_t gc(std::uint32_t n);

  std::uint64_t base() const { return range_.base; }
  std::uint32_t num_chunks() const { return static_cast<std::uint32_t>(chunk_id_.size()); }
  std::uint32_t mapped_chunks() const { return mapped_; }
  std::uint32_t live_chunks() const { return live_; }
  std::uint32_t idle_chunks() const { return mapped_ - live_; }
  std::size_t num_allocations() const { return allocs_.size(); }
  void check_invariants() const;

 private:
  void insert_free(std::uint32_t off, std::uint32_t len);
  void erase_free(std::uint32_t off, std::uint32_t len);

  ChunkPool& pool_;
  VirtualRange range_;
  std::vector<ChunkId> chunk_id_;  // per chunk of the range: pool chunk or kNoChunk
  std::vector<std::uint8_t> live_flag_;
  std::map<std::uint32_t, std::uint32_t> free_by_off_;             // offset -> length (chunks)
  std::set<std::pair<std::uint32_t, std::uint32_t>> free_by_len_;  // (length, offset)
  std::unordered_map<std::uint32_t, std::uint32_t> allocs_;        // offset -> length
  std::uint32_t mapped_ = 0;
  std::uint32_t live_ = 0;  // chunks under live allocations (all mapped)
  std::vector<std::uint64_t> addrs_;
  std::vector<ChunkId> ids_;
  std::vector<std::uint32_t> where_;
};

}  // namespace kvmm
