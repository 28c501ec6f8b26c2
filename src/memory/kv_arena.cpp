#include "kvmm/memory/kv_arena.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

namespace kvmm {

KVArena::KVArena(ChunkPool& pool, const KVLayout& layout, const KVArenaOptions& options)
    : pool_(pool),
      layout_(layout),
      num_pages_(options.num_large_pages),
      large_page_bytes_(layout.large_page_bytes()),
      chunk_bytes_(pool.chunk_bytes()),
      backing_(options.backing) {
  if (num_pages_ == 0 || num_pages_ == kNullPage) fail("num_large_pages = {}: must be in [1, 2^32-1)", num_pages_);
  if (backing_ != ArenaBacking::kFull && backing_ != ArenaBacking::kElastic)
    fail("backing = {}: not an ArenaBacking", static_cast<int>(backing_));
  const std::uint64_t bytes = checked_mul(num_pages_, large_page_bytes_, "num_large_pages * large_page_bytes");
  const std::uint64_t chunks = ceil_div(bytes, chunk_bytes_);
  if (chunks >= kNoChunk) fail("num_large_pages = {}: the arena needs {} chunks, more than 2^32-2", num_pages_, chunks);
  // Host memory first, address space last: a failure leaves nothing to undo.
  chunk_id_.assign(chunks, kNoChunk);
  users_.assign(chunks, 0);
  pinned_.assign(num_pages_, 0);
  addrs_.reserve(chunks);
  ids_.reserve(chunks);
  if (!pool_.reserve(bytes, &range_))
    fail("num_large_pages = {}: cannot reserve {} bytes of address space", num_pages_, bytes);
  if (backing_ != ArenaBacking::kFull) return;
  bool ok = false;
  try {
    ok = back_chunks(0, num_chunks() - 1);
  } catch (...) {
    pool_.free_range(range_);
    throw;
  }
  if (!ok) {
    pool_.free_range(range_);
    fail("num_large_pages = {}: the pool cannot back all {} chunks", num_pages_, chunks);
  }
}

KVArena::~KVArena() {
  // A destructor cannot raise: a chunk the backend fails to unmap stays with the pool,
  // which releases it when it goes.
  for (std::uint32_t c = 0; c < num_chunks(); ++c) {
    if (!chunk_backed(c)) continue;
    users_[c] = 0;
    try {
      release_chunk(c);
    } catch (...) {
    }
  }
  try {
    pool_.free_range(range_);
  } catch (...) {
  }
}

std::uint64_t KVArena::large_page_address(LargePageId large) const {
  if (large.index >= num_pages_) fail("large page id = {}: arena holds {} large pages", large.index, num_pages_);
  return range_.base + std::uint64_t{large.index} * large_page_bytes_;
}

std::uint64_t KVArena::small_page_address(GroupId g, PageId small) const {
  const std::uint64_t size = layout_.small_page_bytes(g);
  const std::uint64_t limit = std::uint64_t{num_pages_} * layout_.small_pages_per_large_page(g);
  if (small >= limit) fail("small page id = {}: group {} has {} small pages in this arena", small, g, limit);
  return range_.base + std::uint64_t{small} * size;
}

PagedLayerView KVArena::layer_view(GroupId g, std::uint32_t layer) const {
  return PagedLayerView{range_.base + layout_.k_offset(g, layer), range_.base + layout_.v_offset(g, layer),
                        layout_.small_page_bytes(g)};
}

bool KVArena::back_chunks(std::uint32_t first, std::uint32_t last) {
  if (first > last || last >= num_chunks()) fail("chunks [{}, {}]: arena has {} chunks", first, last, num_chunks());
  addrs_.clear();
  for (std::uint32_t c = first; c <= last; ++c)
    if (!chunk_backed(c)) addrs_.push_back(range_.base + std::uint64_t{c} * chunk_bytes_);
  if (addrs_.empty()) return true;
  ids_.resize(addrs_.size());
  if (!pool_.map_batch(ChunkOwner::kKVArena, addrs_, ids_)) return false;
  std::size_t k = 0;
  for (std::uint32_t c = first; c <= last; ++c)
    if (!chunk_backed(c)) chunk_id_[c] = ids_[k++];
  num_backed_ += static_cast<std::uint32_t>(addrs_.size());
  return true;
}

void KVArena::release_chunk(std::uint32_t c) {
  if (c >= num_chunks() || !chunk_backed(c)) fail("chunk = {}: not a backed chunk of this arena", c);
  if (users_[c] != 0) fail("chunk = {}: {} live large page(s) lie on it", c, users_[c]);
  const ChunkId id = chunk_id_[c];
  pool_.unmap_batch(std::span<const ChunkId>(&id, 1));
  chunk_id_[c] = kNoChunk;
  --num_backed_;
}

bool KVArena::pin(LargePageId large) {
  if (large.index >= num_pages_) fail("large page id = {}: arena holds {} large pages", large.index, num_pages_);
  if (pinned_[large.index]) fail("large page id = {}: already pinned", large.index);
  const std::uint32_t first = first_chunk(large), last = last_chunk(large);
  if (!back_chunks(first, last)) return false;
  for (std::uint32_t c = first; c <= last; ++c) ++users_[c];
  pinned_[large.index] = 1;
  return true;
}

void KVArena::unpin(LargePageId large) {
  if (large.index >= num_pages_) fail("large page id = {}: arena holds {} large pages", large.index, num_pages_);
  if (!pinned_[large.index]) fail("large page id = {}: not pinned", large.index);
  const std::uint32_t first = first_chunk(large), last = last_chunk(large);
  pinned_[large.index] = 0;
  for (std::uint32_t c = first; c <= last; ++c) --users_[c];
  if (backing_ != ArenaBacking::kElastic) return;
  for (std::uint32_t c = first; c <= last; ++c)
    if (users_[c] == 0 && chunk_backed(c)) release_chunk(c);
}

}  // namespace kvmm
