#include "kvmm/memory/arena_page_pool.hpp"

#include "kvmm/error.hpp"

namespace kvmm {

ArenaPagePool::ArenaPagePool(KVArena& arena)
    : arena_(arena),
      owner_(arena.num_large_pages(), kNoGroup),
      next_(arena.num_large_pages(), kNone),
      prev_(arena.num_large_pages(), kNone),
      rank_(arena.num_large_pages(), kUnbacked),
      head_{kNone, kNone, kNone} {
  // Push in reverse so each list hands out low ids first.
  for (std::uint32_t j = capacity(); j-- > 0;) link(j, rank_of(j));
  num_free_ = capacity();
}

ArenaPagePool::Rank ArenaPagePool::rank_of(std::uint32_t j) const {
  bool busy = false;
  for (std::uint32_t c = arena_.first_chunk(LargePageId{j}); c <= arena_.last_chunk(LargePageId{j}); ++c) {
    if (!arena_.chunk_backed(c)) return kUnbacked;
    busy |= arena_.chunk_users(c) > 0;
  }
  return busy ? kBusy : kIdle;
}

void ArenaPagePool::link(std::uint32_t j, Rank r) {
  rank_[j] = r;
  prev_[j] = kNone;
  next_[j] = head_[r];
  if (head_[r] != kNone) prev_[head_[r]] = j;
  head_[r] = j;
}

void ArenaPagePool::unlink(std::uint32_t j) {
  const Rank r = rank_[j];
  if (prev_[j] != kNone)
    next_[prev_[j]] = next_[j];
  else
    head_[r] = next_[j];
  if (next_[j] != kNone) prev_[next_[j]] = prev_[j];
  rank_[j] = kUsed;
}

// Re-ranks the free pages that overlap chunk c after its backing or users changed.
void ArenaPagePool::rerank_chunk(std::uint32_t c) {
  const std::uint64_t cb = arena_.chunk_bytes();
  const std::uint64_t lp = arena_.large_page_bytes();
  const std::uint32_t first = static_cast<std::uint32_t>(c * cb / lp);
  std::uint32_t last = static_cast<std::uint32_t>(((c + std::uint64_t{1}) * cb - 1) / lp);
  if (last >= capacity()) last = capacity() - 1;
  // Descending, so the lowest id ends up at the head of its list.
  for (std::uint32_t j = last + 1; j-- > first;) {
    if (rank_[j] == kUsed) continue;
    const Rank r = rank_of(j);
    if (r == rank_[j]) continue;
    unlink(j);
    link(j, r);
  }
}

std::optional<LargePageId> ArenaPagePool::allocate(GroupId owner) {
  if (owner == kNoGroup) fail("owner = {}: not a group id", owner);
  std::uint32_t j = kNone;
  for (int r = kBusy; r >= kUnbacked && j == kNone; --r) j = head_[r];
  if (j == kNone) return std::nullopt;
  if (!arena_.pin(LargePageId{j})) return std::nullopt;  // backs the chunks of an unbacked page
  unlink(j);
  owner_[j] = owner;
  --num_free_;
  for (std::uint32_t c = arena_.first_chunk(LargePageId{j}); c <= arena_.last_chunk(LargePageId{j}); ++c)
    rerank_chunk(c);
  return LargePageId{j};
}

void ArenaPagePool::free(LargePageId large) {
  const std::uint32_t id = large.index;
  if (id >= capacity()) fail("large page id = {}: pool capacity is {}", id, capacity());
  if (owner_[id] == kNoGroup) fail("large page id = {}: double free (page is already free)", id);
  owner_[id] = kNoGroup;
  ++num_free_;
  // The page is free whether or not the arena manages to unmap its emptied chunks: the
  // free lists are brought up to date before a backend exception propagates.
  try {
    arena_.unpin(large);
  } catch (...) {
    relink(id);
    throw;
  }
  relink(id);
}

void ArenaPagePool::relink(std::uint32_t j) {
  link(j, rank_of(j));
  for (std::uint32_t c = arena_.first_chunk(LargePageId{j}); c <= arena_.last_chunk(LargePageId{j}); ++c)
    rerank_chunk(c);
}

void ArenaPagePool::check_invariants() const {
  std::vector<std::uint32_t> users(arena_.num_chunks(), 0);
  std::uint32_t free_pages = 0;
  for (std::uint32_t j = 0; j < capacity(); ++j) {
    if (owner_[j] != kNoGroup) {
      if (rank_[j] != kUsed) fail("arena page pool: used page {} is on a free list", j);
      for (std::uint32_t c = arena_.first_chunk(LargePageId{j}); c <= arena_.last_chunk(LargePageId{j}); ++c) {
        ++users[c];
        if (!arena_.chunk_backed(c)) fail("arena page pool: used page {} sits on unbacked chunk {}", j, c);
      }
    } else {
      ++free_pages;
      if (rank_[j] != rank_of(j))
        fail("arena page pool: free page {} has rank {}, expected {}", j, int(rank_[j]), int(rank_of(j)));
    }
  }
  std::uint32_t listed = 0;
  for (int r = kUnbacked; r <= kBusy; ++r) {
    std::uint32_t prev = kNone;
    for (std::uint32_t j = head_[r]; j != kNone; j = next_[j]) {
      if (rank_[j] != r || prev_[j] != prev || owner_[j] != kNoGroup)
        fail("arena page pool: list {} is broken at page {}", r, j);
      prev = j;
      if (++listed > capacity()) fail("arena page pool: list {} has a cycle", r);
    }
  }
  if (listed != free_pages || free_pages != num_free_)
    fail("arena page pool: {} free pages, {} listed, counter {}", free_pages, listed, num_free_);
  std::uint32_t backed = 0;
  for (std::uint32_t c = 0; c < users.size(); ++c) {
    if (users[c] != arena_.chunk_users(c))
      fail("arena page pool: chunk {} has {} users, arena counts {}", c, users[c], arena_.chunk_users(c));
    backed += arena_.chunk_backed(c);
    // (An elastic chunk without users is normally unmapped; it stays backed, and is
    // reused first, only after the backend raised on its unmap.)
    if (users[c] > 0 && !arena_.chunk_backed(c))
      fail("arena page pool: chunk {} has {} users but is not backed", c, users[c]);
    if (arena_.backing() == ArenaBacking::kFull && !arena_.chunk_backed(c))
      fail("arena page pool: full arena chunk {} unbacked", c);
  }
  if (backed != arena_.num_backed_chunks())
    fail("arena page pool: {} chunks backed, arena says {}", backed, arena_.num_backed_chunks());
}

}  // namespace kvmm
