// ChunkPool: the one physical pool the KV arena, virtual KV tensors and activations draw
// from (eLLM's unified pool); every chunk has an owner, every owner a quota. map_batch()
// is a transaction (idle handles first, then create; map; one set_access per run; any
// failure, by false or by exception, undoes all). Bookkeeping O(batch), no steady-state
// heap use; the cost is about one backend call per chunk plus one per run, and an
// O(log ranges) check per address. Thread-safe (one mutex).
#pragma once

#include "kvmm/memory/backend.hpp"

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace kvmm {

enum class ChunkOwner : std::uint8_t { kFree = 0, kKVArena = 1, kVirtualTensor = 2, kActivation = 3 };
inline constexpr std::size_t kNumChunkOwners = 4;
const char* to_string(ChunkOwner owner);

using ChunkId = std::uint32_t;
inline constexpr ChunkId kNoChunk = ~ChunkId{0};

struct ChunkPoolOptions {
  // Physical budget in chunks (all owners together).
  std::uint32_t max_chunks = 0;
  // Chunks created at construction, ahead of need (handles are then reused).
  std::uint32_t precreate_chunks = 0;
};

struct ChunkPoolStats {
  std::uint32_t created = 0;  // physical chunks alive in the backend
  std::uint32_t idle = 0;     // created, owned by nobody, mapped nowhere
  std::uint32_t mapped = 0;   // owned and mapped
  std::uint32_t owned[kNumChunkOwners] = {};
  std::uint64_t backend_calls = 0;  // acquiring + releasing backend calls made so far
};

class ChunkPool {
 public:
  ChunkPool(MemoryBackend& backend, const ChunkPoolOptions& options);
  // Unmaps and releases every chunk; the ranges must have been freed by their users.
  ~ChunkPool();
  ChunkPool(const ChunkPool&) = delete;
  ChunkPool& operator=(const ChunkPool&) = delete;

  MemoryBackend& backend() { return backend_; }
  std::uint64_t chunk_bytes() const { return chunk_bytes_; }
  std::uint32_t capacity() const { return static_cast<std::uint32_t>(owner_.size()); }

  // Reserves through the backend and records the range: map_batch maps only inside
  // ranges reserved here. free_range raises kvmm::Error for a range not reserved here
  // or with a chunk still mapped in it.
  bool reserve(std::uint64_t bytes, VirtualRange* out);
  void free_range(const VirtualRange& range);

  // One chunk mapped at each address in `addrs` (chunk aligned, inside a range reserved
  // here, each once, currently unmapped), owned by `owner`; chunk ids written to
  // `ids_out` (same length). Consecutive addresses form a run that gets one set_access
  // call. false, with nothing changed, if the owner's quota, the pool or the backend is
  // short. Bad arguments raise kvmm::Error before any backend call; a backend that raises
  // (e.g. an address already mapped) has the batch undone and its exception propagated.
  bool map_batch(ChunkOwner owner, std::span<const std::uint64_t> addrs, std::span<ChunkId> ids_out);
  // Unmaps the chunks (one backend call per contiguous run) and makes them idle; the
  // physical handles are kept for reuse. Raises kvmm::Error for an unmapped id. Should
  // the backend raise (breaking its promise), the runs before the failing one are
  // unmapped and the rest stay mapped and owned; the exception propagates.
  void unmap_batch(std::span<const ChunkId> ids);

  // Quotas: the most chunks an owner may hold. Start at max_chunks for every owner;
  // set_quota accepts at most max_chunks (move_quota may carry an owner above it).
  void set_quota(ChunkOwner owner, std::uint32_t quota);
  std::uint32_t quota(ChunkOwner owner) const;
  std::uint32_t owned(ChunkOwner owner) const;
  // Moves `n` chunks of quota from one owner to another if `from` holds at most
  // quota - n chunks; all or nothing (eLLM's ownership transfer, no hold-and-wait).
  bool move_quota(ChunkOwner from, ChunkOwner to, std::uint32_t n);
  // Chunks `owner` could still map now: min(quota slack, idle + creatable).
  std::uint32_t available(ChunkOwner owner) const;

  // Creates idle chunks until `n` are idle (bounded by capacity); false on failure
  // (the chunks created so far stay idle).
  bool precreate(std::uint32_t n);
  // Releases idle chunks to the backend until at most `keep` are idle.
  void trim(std::uint32_t keep);

  ChunkOwner owner(ChunkId id) const;
  std::uint64_t address(ChunkId id) const;  // 0 while unmapped
  ChunkPoolStats stats() const;
  // Raises kvmm::Error naming the first broken invariant. O(capacity + ranges).
  void check_invariants() const;

 private:
  // How far a map_batch got: handles taken from idle, handles created, chunks mapped.
  struct Progress {
    std::size_t from_idle = 0, created = 0, mapped = 0;
  };
  void check_addresses(std::span<const std::uint64_t> addrs);
  bool map_locked(ChunkOwner owner, std::span<const std::uint64_t> addrs, Progress& p);
  void rollback(const Progress& p, std::span<const std::uint64_t> addrs);
  void commit_unmapped(std::span<const ChunkId> ids);
  bool in_ranges(std::uint64_t addr) const;
  ChunkId check_id(ChunkId id) const;

  MemoryBackend& backend_;
  std::uint64_t chunk_bytes_;
  mutable std::mutex mutex_;
  std::vector<ChunkHandle> handle_;
  std::vector<ChunkOwner> owner_;
  std::vector<std::uint64_t> addr_;
  std::vector<std::uint8_t> created_;
  std::vector<ChunkId> idle_;          // stack of created, unowned chunks
  std::vector<ChunkId> unborn_;        // stack of ids with no physical chunk
  std::vector<ChunkId> scratch_;       // ids taken by the batch in progress
  std::vector<std::uint64_t> sorted_;  // scratch: a batch's addresses, sorted
  std::vector<VirtualRange> ranges_;   // reserved through this pool, sorted by base
  std::uint32_t quota_[kNumChunkOwners] = {};
  std::uint32_t owned_[kNumChunkOwners] = {};
  std::uint32_t num_created_ = 0;
  std::uint32_t num_mapped_ = 0;
  std::uint64_t backend_calls_ = 0;
};

}  // namespace kvmm
