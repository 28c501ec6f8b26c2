// ArenaPagePool: LargePagePool's interface (allocate(owner)/free/num_free/capacity/owner)
// over a KVArena. Prefers free pages in backed busy chunks, then backed idle ones, then
// unbacked ones, so elastic chunks empty out and are released. allocate/free: O(1) plus
// re-ranking the pages that share a chunk; backing a chunk is one ChunkPool transaction.
#pragma once

#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/paging/large_page_pool.hpp"

#include <cstdint>
#include <optional>
#include <vector>

namespace kvmm {

class ArenaPagePool final : public LargePageSource {
 public:
  explicit ArenaPagePool(KVArena& arena);

  // std::nullopt when every page is used or no chunk can be backed (not an error).
  std::optional<PageId> allocate(GroupId owner);
  // Raises kvmm::Error for an id out of range or already free. In an elastic arena a
  // chunk whose large pages are all free is unmapped here (should the backend raise on
  // that unmap, the page is free all the same, the chunk stays backed and idle, and the
  // exception propagates).
  void free(PageId id);

  // LargePageSource: the paging layer's pool calls these.
  std::optional<PageId> acquire(GroupId owner) override { return allocate(owner); }
  void release(PageId id) override { free(id); }
  void reassign(PageId id, GroupId owner) override {
    if (id < owner_.size() && owner_[id] != kNoGroup && owner != kNoGroup) owner_[id] = owner;
  }

  std::uint32_t capacity() const override { return static_cast<std::uint32_t>(owner_.size()); }
  std::uint32_t num_free() const override { return num_free_; }
  std::uint32_t num_used() const { return capacity() - num_free_; }
  GroupId owner(PageId id) const {
    if (id >= owner_.size()) fail("large page id = {}: pool capacity is {}", id, owner_.size());
    return owner_[id];
  }
  KVArena& arena() { return arena_; }
  // Used large pages overlapping arena chunk c.
  std::uint32_t chunk_users(std::uint32_t c) const { return arena_.chunk_users(c); }
  // Raises kvmm::Error naming the first broken invariant. O(pages + chunks).
  void check_invariants() const;

 private:
  enum Rank : std::uint8_t { kUnbacked = 0, kIdle = 1, kBusy = 2, kUsed = 3 };
  Rank rank_of(PageId j) const;
  void link(PageId j, Rank r);
  void unlink(PageId j);
  void rerank_chunk(std::uint32_t c);
  void relink(PageId id);  // a freed page back on its list; its chunks' pages re-ranked

  KVArena& arena_;
  std::vector<GroupId> owner_;
  std::vector<PageId> next_, prev_;  // intrusive free lists, one per rank
  std::vector<Rank> rank_;
  PageId head_[3];
  std::uint32_t num_free_ = 0;
};

}  // namespace kvmm
