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
  std::optional<LargePageId> allocate(GroupId owner);
  // Raises kvmm::Error for an id out of range or already free. In an elastic arena a
  // chunk whose large pages are all free is unmapped here (should the backend raise on
  // that unmap, the page is free all the same, the chunk stays backed and idle, and the
  // exception propagates).
  void free(LargePageId id);

  // LargePageSource: the paging layer's pool calls these.
  std::optional<LargePageId> acquire(GroupId owner) override { return allocate(owner); }
  void release(LargePageId id) override { free(id); }
  void reassign(LargePageId id, GroupId owner) override {
    if (id.index < owner_.size() && owner_[id.index] != kNoGroup && owner != kNoGroup) owner_[id.index] = owner;
  }

  std::uint32_t capacity() const override { return static_cast<std::uint32_t>(owner_.size()); }
  std::uint32_t num_free() const override { return num_free_; }
  std::uint32_t num_used() const { return capacity() - num_free_; }
  GroupId owner(LargePageId id) const {
    if (id.index >= owner_.size()) fail("large page id = {}: pool capacity is {}", id.index, owner_.size());
    return owner_[id.index];
  }
  KVArena& arena() { return arena_; }
  // Used large pages overlapping arena chunk c.
  std::uint32_t chunk_users(std::uint32_t c) const { return arena_.chunk_users(c); }
  // Raises kvmm::Error naming the first broken invariant. O(pages + chunks).
  void check_invariants() const;

 private:
  // The free lists hold bare large page indices (kNone ends them): private words.
  static constexpr std::uint32_t kNone = kNoLargePage.index;
  enum Rank : std::uint8_t { kUnbacked = 0, kIdle = 1, kBusy = 2, kUsed = 3 };
  Rank rank_of(std::uint32_t j) const;
  void link(std::uint32_t j, Rank r);
  void unlink(std::uint32_t j);
  void rerank_chunk(std::uint32_t c);
  void relink(std::uint32_t j);  // a freed page back on its list; its chunks' pages re-ranked

  KVArena& arena_;
  std::vector<GroupId> owner_;
  std::vector<std::uint32_t> next_, prev_;  // intrusive free lists, one per rank
  std::vector<Rank> rank_;
  std::uint32_t head_[3];
  std::uint32_t num_free_ = 0;
};

}  // namespace kvmm
