#include "kvmm/memory/activation_allocator.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

namespace kvmm {

ActivationAllocator::ActivationAllocator(ChunkPool& pool, std::uint64_t max_bytes) : pool_(pool) {
  const std::uint64_t cb = pool.chunk_bytes();
  const std::uint64_t chunks = ceil_div(max_bytes, cb);
  if (chunks == 0 || chunks >= kNoChunk) fail("max_bytes = {}: must be between 1 byte and 2^32-2 chunks", max_bytes);
  const std::uint64_t bytes = checked_mul(chunks, cb, "max_bytes rounded up to whole chunks");
  // Host memory first, address space last: a failure leaves nothing to undo.
  chunk_id_.assign(chunks, kNoChunk);
  live_flag_.assign(chunks, 0);
  insert_free(0, static_cast<std::uint32_t>(chunks));
  if (!pool_.reserve(bytes, &range_)) fail("max_bytes = {}: cannot reserve the address space", max_bytes);
}

ActivationAllocator::~ActivationAllocator() {
  // A destructor cannot raise: a chunk the backend fails to unmap stays with the pool.
  for (std::uint32_t c = 0; c < num_chunks(); ++c) {
    if (chunk_id_[c] == kNoChunk) continue;
    try {
      pool_.unmap_batch(std::span<const ChunkId>(&chunk_id_[c], 1));
    } catch (...) {
    }
  }
  try {
    pool_.free_range(range_);
  } catch (...) {
  }
}

void ActivationAllocator::insert_free(std::uint32_t off, std::uint32_t len) {
  free_by_off_.emplace(off, len);
  free_by_len_.emplace(len, off);
}

void ActivationAllocator::erase_free(std::uint32_t off, std::uint32_t len) {
  free_by_off_.erase(off);
  free_by_len_.erase({len, off});
}

std::optional<std::uint64_t> ActivationAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t cb = pool_.chunk_bytes();
  if (bytes == 0) fail("bytes = {}: cannot allocate nothing", bytes);
  const std::uint64_t n64 = ceil_div(bytes, cb);  // (bytes + cb - 1) wraps for 2^64-1
  if (n64 > num_chunks()) return std::nullopt;
  const auto n = static_cast<std::uint32_t>(n64);
  auto it = free_by_len_.lower_bound({n, 0});  // best fit: smallest extent that holds n
  if (it == free_by_len_.end()) return std::nullopt;
  const auto [len, off] = *it;
  addrs_.clear();
  where_.clear();
  for (std::uint32_t c = off; c < off + n; ++c)
    if (chunk_id_[c] == kNoChunk) {
      addrs_.push_back(range_.base + c * cb);
      where_.push_back(c);
    }
  if (!addrs_.empty()) {
    ids_.resize(addrs_.size());
    if (!pool_.map_batch(ChunkOwner::kActivation, addrs_, ids_)) return std::nullopt;
    for (std::size_t k = 0; k < where_.size(); ++k) chunk_id_[where_[k]] = ids_[k];
    mapped_ += static_cast<std::uint32_t>(where_.size());
  }
  erase_free(off, len);
  if (len > n) insert_free(off + n, len - n);
  allocs_.emplace(off, n);
  for (std::uint32_t c = off; c < off + n; ++c) live_flag_[c] = 1;
  live_ += n;
  return range_.base + off * cb;
}

void ActivationAllocator::free(std::uint64_t addr) {
  const std::uint64_t cb = pool_.chunk_bytes();
  if (addr < range_.base || addr - range_.base >= range_.bytes || (addr - range_.base) % cb != 0)
    fail("addr = {:#x}: not an activation allocation", addr);
  auto a = allocs_.find(static_cast<std::uint32_t>((addr - range_.base) / cb));
  if (a == allocs_.end()) fail("addr = {:#x}: not a live activation allocation (double free?)", addr);
  std::uint32_t off = a->first, len = a->second;
  allocs_.erase(a);
  for (std::uint32_t c = off; c < off + len; ++c) live_flag_[c] = 0;
  live_ -= len;
  // Coalesce with both neighbours.
  auto next = free_by_off_.lower_bound(off);
  if (next != free_by_off_.end() && next->first == off + len) {
    const std::uint32_t nl = next->second;
    erase_free(next->first, nl);
    len += nl;
  }
  auto prev = free_by_off_.lower_bound(off);
  if (prev != free_by_off_.begin()) {
    --prev;
    if (prev->first + prev->second == off) {
      const std::uint32_t po = prev->first, pl = prev->second;
      erase_free(po, pl);
      off = po;
      len += pl;
    }
  }
  insert_free(off, len);
}

std::uint32_t ActivationAllocator::gc(std::uint32_t n) {
  ids_.clear();
  where_.clear();
  for (std::uint32_t c = num_chunks(); c-- > 0 && ids_.size() < n;) {
    if (chunk_id_[c] == kNoChunk || live_flag_[c]) continue;
    ids_.push_back(chunk_id_[c]);
    where_.push_back(c);
  }
  if (ids_.empty()) return 0;
  try {
    pool_.unmap_batch(ids_);
  } catch (...) {
    // The backend raised part way: keep exactly the chunks still mapped here (an
    // unmapped one may already be mapped elsewhere by another pool user).
    for (std::size_t k = 0; k < where_.size(); ++k)
      if (pool_.address(ids_[k]) != range_.base + std::uint64_t{where_[k]} * pool_.chunk_bytes())
        chunk_id_[where_[k]] = kNoChunk, --mapped_;
    throw;
  }
  for (std::uint32_t c : where_) chunk_id_[c] = kNoChunk;
  mapped_ -= static_cast<std::uint32_t>(ids_.size());
  return static_cast<std::uint32_t>(ids_.size());
}

void ActivationAllocator::check_invariants() const {
  std::vector<std::uint8_t> cover(num_chunks(), 0);
  std::uint32_t live = 0, mapped = 0;
  for (auto [off, len] : allocs_)
    for (std::uint32_t c = off; c < off + len; ++c) {
      if (cover[c]++) fail("activation allocator: chunk {} is in two extents", c);
      if (chunk_id_[c] == kNoChunk || !live_flag_[c])
        fail("activation allocator: live chunk {} is unmapped or unflagged", c);
      ++live;
    }
  std::uint32_t prev_end = 0;
  bool first = true;
  for (auto [off, len] : free_by_off_) {
    if (len == 0 || free_by_len_.count({len, off}) != 1)
      fail("activation allocator: free extent at {} is not indexed", off);
    if (!first && off == prev_end) fail("activation allocator: free extents at {} were not coalesced", off);
    for (std::uint32_t c = off; c < off + len; ++c) {
      if (cover[c]++) fail("activation allocator: chunk {} is in two extents", c);
      if (live_flag_[c]) fail("activation allocator: free chunk {} is flagged live", c);
    }
    prev_end = off + len;
    first = false;
  }
  if (free_by_len_.size() != free_by_off_.size()) fail("activation allocator: free indexes differ in size");
  for (std::uint32_t c = 0; c < num_chunks(); ++c) {
    if (!cover[c]) fail("activation allocator: chunk {} is in no extent", c);
    if (chunk_id_[c] != kNoChunk) {
      ++mapped;
      if (pool_.owner(chunk_id_[c]) != ChunkOwner::kActivation ||
          pool_.address(chunk_id_[c]) != range_.base + c * pool_.chunk_bytes())
        fail("activation allocator: chunk {} is not mapped where it should be", c);
    }
  }
  if (live != live_ || mapped != mapped_)
    fail("activation allocator: counters disagree ({} live, {} mapped)", live, mapped);
}

}  // namespace kvmm
