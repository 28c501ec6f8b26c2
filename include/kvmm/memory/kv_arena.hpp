// KVArena: all large pages of the paging layer in one reserved range, backed by ChunkPool
// chunks fully at construction or elastically (via ArenaPagePool). Large page j is at
// base + j * large_page_bytes, small page p of group g at base + p * small_page_bytes(g).
// Address queries are O(1); backing is one ChunkPool transaction over missing chunks;
// the arena counts the live large pages on each chunk, so no chunk under one is released.
#pragma once

#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/spec/kv_layout.hpp"
#include "kvmm/types.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvmm {

enum class ArenaBacking : std::uint8_t { kFull, kElastic };

struct KVArenaOptions {
  std::uint32_t num_large_pages = 0;
  ArenaBacking backing = ArenaBacking::kElastic;
};

// What a paged kernel needs for one layer of one group: K and V base addresses and the
// page stride in bytes (the small page size, never the layer's own slice size).
struct PagedLayerView {
  std::uint64_t k_base = 0;
  std::uint64_t v_base = 0;
  std::uint64_t page_stride = 0;
};

class KVArena {
 public:
  // Raises kvmm::Error if num_large_pages is 0 or its size overflows, the range cannot be
  // reserved, or (full backing) the pool cannot back every chunk; nothing is left behind.
  KVArena(ChunkPool& pool, const KVLayout& layout, const KVArenaOptions& options);
  ~KVArena();
  KVArena(const KVArena&) = delete;
  KVArena& operator=(const KVArena&) = delete;

  std::uint64_t base() const { return range_.base; }
  std::byte* data() const { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(range_.base)); }
  std::uint64_t bytes() const { return range_.bytes; }
  std::uint32_t num_large_pages() const { return num_pages_; }
  std::uint64_t large_page_bytes() const { return large_page_bytes_; }
  std::uint64_t chunk_bytes() const { return chunk_bytes_; }
  ArenaBacking backing() const { return backing_; }
  const KVLayout& layout() const { return layout_; }

  std::uint64_t large_page_address(LargePageId large) const;  // raises for an id out of range
  std::uint64_t small_page_address(GroupId g, PageId small) const;
  PagedLayerView layer_view(GroupId g, std::uint32_t layer) const;

  // Chunk-level backing, used by ArenaPagePool. Chunks of large page j are
  // [first_chunk(j), last_chunk(j)].
  std::uint32_t num_chunks() const { return static_cast<std::uint32_t>(chunk_id_.size()); }
  std::uint32_t first_chunk(LargePageId large) const {
    return static_cast<std::uint32_t>(large.index * large_page_bytes_ / chunk_bytes_);
  }
  std::uint32_t last_chunk(LargePageId large) const {
    return static_cast<std::uint32_t>(((large.index + std::uint64_t{1}) * large_page_bytes_ - 1) / chunk_bytes_);
  }
  bool chunk_backed(std::uint32_t c) const { return chunk_id_[c] != kNoChunk; }
  std::uint32_t num_backed_chunks() const { return num_backed_; }
  // Live large pages (pinned) overlapping chunk c.
  std::uint32_t chunk_users(std::uint32_t c) const { return users_[c]; }
  // Maps every unbacked chunk of [first, last] in one transaction; false, nothing
  // changed, if memory is short (a backend exception propagates, nothing changed).
  bool back_chunks(std::uint32_t first, std::uint32_t last);
  // Unmaps one backed chunk. Raises kvmm::Error if a live large page lies on it.
  void release_chunk(std::uint32_t c);

  // A large page goes live: its chunks are backed (one transaction, none if all are) and
  // counted as in use; false, nothing changed, if memory is short. Raises kvmm::Error
  // for a page out of range or already pinned.
  bool pin(LargePageId large);
  // The page holds no live data any more; in an elastic arena the chunks it leaves
  // without users are unmapped. Raises kvmm::Error if the page was not pinned. Should the
  // backend raise on an unmap, the page is unpinned all the same, that chunk and the
  // page's later ones stay backed (idle), and the exception propagates.
  void unpin(LargePageId large);

 private:
  ChunkPool& pool_;
  KVLayout layout_;
  VirtualRange range_;
  std::uint32_t num_pages_ = 0;
  std::uint64_t large_page_bytes_ = 0;
  std::uint64_t chunk_bytes_ = 0;
  ArenaBacking backing_;
  std::vector<ChunkId> chunk_id_;     // per arena chunk: pool chunk id or kNoChunk
  std::vector<std::uint32_t> users_;  // per arena chunk: pinned large pages on it
  std::vector<std::uint8_t> pinned_;  // per large page
  std::uint32_t num_backed_ = 0;
  std::vector<std::uint64_t> addrs_;  // scratch for back_chunks
  std::vector<ChunkId> ids_;
};

}  // namespace kvmm
