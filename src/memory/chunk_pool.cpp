#include "kvmm/memory/chunk_pool.hpp"

#include "kvmm/error.hpp"

#include <algorithm>
#include <limits>

namespace kvmm {

const char* to_string(ChunkOwner owner) {
  switch (owner) {
    case ChunkOwner::kFree:
      return "free";
    case ChunkOwner::kKVArena:
      return "kv-arena";
    case ChunkOwner::kVirtualTensor:
      return "virtual-tensor";
    case ChunkOwner::kActivation:
      return "activation";
  }
  return "?";
}

namespace {
std::size_t idx(ChunkOwner o) { return static_cast<std::size_t>(o); }

// The index of an owner that may hold chunks; kvmm::Error naming `what` for kFree or a
// value outside the enum (which would index past the per-owner arrays).
std::size_t holder(ChunkOwner o, const char* what) {
  if (idx(o) >= kNumChunkOwners) fail("{} = {}: not a ChunkOwner", what, idx(o));
  if (o == ChunkOwner::kFree) fail("{} = {}: chunks are held by an owner, not by free", what, to_string(o));
  return idx(o);
}
}  // namespace

ChunkPool::ChunkPool(MemoryBackend& backend, const ChunkPoolOptions& options)
    : backend_(backend), chunk_bytes_(backend.chunk_bytes()) {
  if (chunk_bytes_ == 0) fail("backend.chunk_bytes() = 0: the {} backend reports no chunk size", backend.name());
  if (options.max_chunks == 0 || options.max_chunks == kNoChunk)
    fail("max_chunks = {}: must be in [1, 2^32-1)", options.max_chunks);
  if (options.precreate_chunks > options.max_chunks)
    fail("precreate_chunks = {}: above max_chunks {}", options.precreate_chunks, options.max_chunks);
  const std::uint32_t n = options.max_chunks;
  handle_.assign(n, 0);
  owner_.assign(n, ChunkOwner::kFree);
  addr_.assign(n, 0);
  created_.assign(n, 0);
  idle_.reserve(n);
  scratch_.reserve(n);
  unborn_.resize(n);
  for (std::uint32_t i = 0; i < n; ++i) unborn_[i] = n - 1 - i;
  for (auto& q : quota_) q = n;
  bool ok = false;
  try {
    ok = precreate(options.precreate_chunks);
  } catch (...) {
    trim(0);
    throw;
  }
  if (!ok) {
    trim(0);
    fail("precreate_chunks = {}: the {} backend could not create them", options.precreate_chunks, backend_.name());
  }
}

// Destructors cannot raise: a backend call that raises here is skipped (the backend
// keeps that chunk or range; nothing else is affected).
ChunkPool::~ChunkPool() {
  std::lock_guard lock(mutex_);
  for (ChunkId id = 0; id < capacity(); ++id) {
    if (!created_[id]) continue;
    try {
      if (addr_[id] != 0) backend_.unmap(addr_[id], chunk_bytes_);
      backend_.release_chunk(handle_[id]);
    } catch (...) {
    }
  }
  for (const VirtualRange& r : ranges_) {  // ranges their users did not free
    try {
      backend_.free_range(r);
    } catch (...) {
    }
  }
}

bool ChunkPool::reserve(std::uint64_t bytes, VirtualRange* out) {
  std::lock_guard lock(mutex_);
  ++backend_calls_;
  VirtualRange r;
  if (!backend_.reserve(bytes, &r)) return false;
  const auto at = std::lower_bound(ranges_.begin(), ranges_.end(), r.base,
                                   [](const VirtualRange& x, std::uint64_t b) { return x.base < b; });
  try {
    ranges_.insert(at, r);
  } catch (...) {
    backend_.free_range(r);
    throw;
  }
  *out = r;
  return true;
}

void ChunkPool::free_range(const VirtualRange& range) {
  std::lock_guard lock(mutex_);
  const auto it = std::lower_bound(ranges_.begin(), ranges_.end(), range.base,
                                   [](const VirtualRange& x, std::uint64_t b) { return x.base < b; });
  if (it == ranges_.end() || it->base != range.base || it->bytes != range.bytes)
    fail("range.base = {:#x}, range.bytes = {}: not reserved through this pool (freed twice?)", range.base,
         range.bytes);
  for (ChunkId id = 0; id < capacity(); ++id)
    if (addr_[id] != 0 && addr_[id] - range.base < range.bytes)
      fail("range.base = {:#x}: chunk {} is still mapped at {:#x} by {}", range.base, id, addr_[id],
           to_string(owner_[id]));
  ++backend_calls_;
  backend_.free_range(range);
  ranges_.erase(it);
}

bool ChunkPool::in_ranges(std::uint64_t addr) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), addr,
                             [](std::uint64_t a, const VirtualRange& x) { return a < x.base; });
  if (it == ranges_.begin()) return false;
  --it;
  return addr - it->base < it->bytes && it->bytes - (addr - it->base) >= chunk_bytes_;
}

// Every address chunk aligned, inside a range reserved here, and listed once: checked
// before any backend call so a bad batch raises with nothing done. Ascending batches
// (the usual case) are checked for repeats in one pass, others through a sorted copy.
void ChunkPool::check_addresses(std::span<const std::uint64_t> addrs) {
  bool ascending = true;
  for (std::size_t k = 0; k < addrs.size(); ++k) {
    const std::uint64_t a = addrs[k];
    if (a == 0 || a % chunk_bytes_ != 0) fail("addrs[{}] = {:#x}: not a chunk-aligned address", k, a);
    if (!in_ranges(a)) fail("addrs[{}] = {:#x}: outside every range reserved through this pool", k, a);
    ascending &= k == 0 || addrs[k - 1] < a;
  }
  if (ascending) return;
  sorted_.assign(addrs.begin(), addrs.end());
  std::sort(sorted_.begin(), sorted_.end());
  const auto dup = std::adjacent_find(sorted_.begin(), sorted_.end());
  if (dup == sorted_.end()) return;
  std::size_t second = 0;
  for (std::size_t k = 0, seen = 0; k < addrs.size(); ++k)
    if (addrs[k] == *dup && seen++ == 1) second = k;
  fail("addrs[{}] = {:#x}: listed twice in one batch", second, *dup);
}

// Undoes a partial batch: unmaps the first `mapped` addresses, releases the chunks
// created for it and puts the idle ones back in their original stack order. (A
// releasing call that raises here, a second failure, propagates and leaves the pool's
// view of those chunks behind the backend's.)
void ChunkPool::rollback(const Progress& p, std::span<const std::uint64_t> addrs) {
  std::size_t i = 0;
  while (i < p.mapped) {
    std::size_t j = i + 1;
    while (j < p.mapped && addrs[j] == addrs[j - 1] + chunk_bytes_) ++j;
    ++backend_calls_;
    backend_.unmap(addrs[i], (j - i) * chunk_bytes_);
    i = j;
  }
  for (std::size_t k = p.from_idle + p.created; k-- > p.from_idle;) {
    const ChunkId id = scratch_[k];
    ++backend_calls_;
    backend_.release_chunk(handle_[id]);
    created_[id] = 0;
    --num_created_;
    unborn_.push_back(id);
  }
  for (std::size_t k = p.from_idle; k-- > 0;) idle_.push_back(scratch_[k]);
  scratch_.clear();
}

// The transaction's acquiring steps; false at the first backend call that fails, with
// `p` saying what to undo.
bool ChunkPool::map_locked(ChunkOwner owner, std::span<const std::uint64_t> addrs, Progress& p) {
  const std::size_t n = addrs.size();
  // 1. Acquire: idle handles first (no backend call), then create.
  p.from_idle = std::min(n, idle_.size());
  for (std::size_t k = 0; k < p.from_idle; ++k) {
    scratch_.push_back(idle_.back());
    idle_.pop_back();
  }
  while (scratch_.size() < n) {
    const ChunkId id = unborn_.back();
    ++backend_calls_;
    if (!backend_.create_chunk(&handle_[id])) return false;
    unborn_.pop_back();
    created_[id] = 1;
    ++num_created_;
    scratch_.push_back(id);
    ++p.created;
  }
  // 2. Map every chunk.
  for (; p.mapped < n; ++p.mapped) {
    ++backend_calls_;
    if (!backend_.map(handle_[scratch_[p.mapped]], addrs[p.mapped])) return false;
  }
  // 3. Access once per contiguous run.
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i + 1;
    while (j < n && addrs[j] == addrs[j - 1] + chunk_bytes_) ++j;
    ++backend_calls_;
    if (!backend_.set_access(addrs[i], (j - i) * chunk_bytes_)) return false;
    i = j;
  }
  // 4. Commit.
  for (std::size_t k = 0; k < n; ++k) {
    const ChunkId id = scratch_[k];
    owner_[id] = owner;
    addr_[id] = addrs[k];
  }
  owned_[idx(owner)] += static_cast<std::uint32_t>(n);
  num_mapped_ += static_cast<std::uint32_t>(n);
  return true;
}

bool ChunkPool::map_batch(ChunkOwner owner, std::span<const std::uint64_t> addrs, std::span<ChunkId> ids_out) {
  holder(owner, "owner");
  if (ids_out.size() != addrs.size()) fail("ids_out.size() = {}: addrs has {}", ids_out.size(), addrs.size());
  std::lock_guard lock(mutex_);
  check_addresses(addrs);
  const std::size_t n = addrs.size();
  if (n == 0) return true;
  if (owned_[idx(owner)] + n > quota_[idx(owner)]) return false;
  if (idle_.size() + unborn_.size() < n) return false;
  scratch_.clear();
  Progress p;
  bool ok = false;
  try {
    ok = map_locked(owner, addrs, p);
  } catch (...) {
    rollback(p, addrs);
    throw;
  }
  if (!ok) {
    rollback(p, addrs);
    return false;
  }
  std::copy(scratch_.begin(), scratch_.end(), ids_out.begin());
  scratch_.clear();
  return true;
}

// Bookkeeping for chunks whose backend unmap has returned.
void ChunkPool::commit_unmapped(std::span<const ChunkId> ids) {
  for (ChunkId id : ids) {
    --owned_[idx(owner_[id])];
    owner_[id] = ChunkOwner::kFree;
    addr_[id] = 0;
    idle_.push_back(id);
  }
  num_mapped_ -= static_cast<std::uint32_t>(ids.size());
}

void ChunkPool::unmap_batch(std::span<const ChunkId> ids) {
  std::lock_guard lock(mutex_);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const ChunkId id = check_id(ids[k]);
    if (addr_[id] == 0) fail("ids[{}] = {}: chunk is not mapped", k, id);
    for (std::size_t m = 0; m < k; ++m)
      if (ids[m] == id) fail("ids[{}] = {}: listed twice", k, id);
  }
  // Run by run, each committed once its backend call returned.
  std::size_t i = 0;
  while (i < ids.size()) {
    std::size_t j = i + 1;
    while (j < ids.size() && addr_[ids[j]] == addr_[ids[j - 1]] + chunk_bytes_) ++j;
    ++backend_calls_;
    backend_.unmap(addr_[ids[i]], (j - i) * chunk_bytes_);
    commit_unmapped(ids.subspan(i, j - i));
    i = j;
  }
}

void ChunkPool::set_quota(ChunkOwner owner, std::uint32_t quota) {
  const std::size_t o = holder(owner, "owner");
  std::lock_guard lock(mutex_);
  if (quota > capacity()) fail("quota = {}: above the pool's capacity of {} chunks", quota, capacity());
  if (quota < owned_[o]) fail("quota = {}: {} already holds {} chunks", quota, to_string(owner), owned_[o]);
  quota_[o] = quota;
}

std::uint32_t ChunkPool::quota(ChunkOwner owner) const {
  const std::size_t o = holder(owner, "owner");
  std::lock_guard lock(mutex_);
  return quota_[o];
}

std::uint32_t ChunkPool::owned(ChunkOwner owner) const {
  const std::size_t o = holder(owner, "owner");
  std::lock_guard lock(mutex_);
  return owned_[o];
}

bool ChunkPool::move_quota(ChunkOwner from, ChunkOwner to, std::uint32_t n) {
  const std::size_t f = holder(from, "from"), t = holder(to, "to");
  if (f == t) fail("from = to = {}: need two different owners", to_string(from));
  std::lock_guard lock(mutex_);
  if (quota_[f] - owned_[f] < n) return false;
  if (std::uint64_t{quota_[t]} + n > std::numeric_limits<std::uint32_t>::max())
    fail("n = {}: {}'s quota {} would pass 2^32-1", n, to_string(to), quota_[t]);
  quota_[f] -= n;
  quota_[t] += n;
  return true;
}

std::uint32_t ChunkPool::available(ChunkOwner owner) const {
  const std::size_t o = holder(owner, "owner");
  std::lock_guard lock(mutex_);
  const std::uint32_t slack = quota_[o] - owned_[o];
  return std::min<std::uint32_t>(slack, static_cast<std::uint32_t>(idle_.size() + unborn_.size()));
}

bool ChunkPool::precreate(std::uint32_t n) {
  std::lock_guard lock(mutex_);
  while (idle_.size() < n && !unborn_.empty()) {
    const ChunkId id = unborn_.back();
    ++backend_calls_;
    if (!backend_.create_chunk(&handle_[id])) return false;
    unborn_.pop_back();
    created_[id] = 1;
    ++num_created_;
    idle_.push_back(id);
  }
  return idle_.size() >= n;
}

void ChunkPool::trim(std::uint32_t keep) {
  std::lock_guard lock(mutex_);
  while (idle_.size() > keep) {
    const ChunkId id = idle_.back();
    ++backend_calls_;
    backend_.release_chunk(handle_[id]);  // a raising backend leaves the chunk idle
    idle_.pop_back();
    created_[id] = 0;
    --num_created_;
    unborn_.push_back(id);
  }
}

ChunkId ChunkPool::check_id(ChunkId id) const {
  if (id >= capacity()) fail("chunk id = {}: pool capacity is {}", id, capacity());
  return id;
}

ChunkOwner ChunkPool::owner(ChunkId id) const {
  std::lock_guard lock(mutex_);
  return owner_[check_id(id)];
}

std::uint64_t ChunkPool::address(ChunkId id) const {
  std::lock_guard lock(mutex_);
  return addr_[check_id(id)];
}

ChunkPoolStats ChunkPool::stats() const {
  std::lock_guard lock(mutex_);
  ChunkPoolStats s;
  s.created = num_created_;
  s.idle = static_cast<std::uint32_t>(idle_.size());
  s.mapped = num_mapped_;
  for (std::size_t o = 0; o < kNumChunkOwners; ++o) s.owned[o] = owned_[o];
  s.backend_calls = backend_calls_;
  return s;
}

void ChunkPool::check_invariants() const {
  std::lock_guard lock(mutex_);
  std::uint32_t owned[kNumChunkOwners] = {};
  std::uint32_t created = 0, mapped = 0;
  std::vector<std::uint8_t> seen(capacity(), 0);
  for (ChunkId id : idle_) {
    if (!created_[id] || owner_[id] != ChunkOwner::kFree || addr_[id] != 0 || seen[id]++)
      fail("chunk pool: idle chunk {} is not created, free and unmapped exactly once", id);
  }
  for (ChunkId id : unborn_) {
    if (created_[id] || seen[id]++) fail("chunk pool: unborn chunk {} is created or listed twice", id);
  }
  for (ChunkId id = 0; id < capacity(); ++id) {
    created += created_[id];
    if (idx(owner_[id]) >= kNumChunkOwners) fail("chunk pool: chunk {} has owner {}", id, idx(owner_[id]));
    if (owner_[id] != ChunkOwner::kFree) {
      if (!created_[id] || addr_[id] == 0 || seen[id]++)
        fail("chunk pool: owned chunk {} is not created and mapped", id);
      if (!in_ranges(addr_[id])) fail("chunk pool: chunk {} is mapped at {:#x}, outside every range", id, addr_[id]);
      ++owned[idx(owner_[id])];
      ++mapped;
    }
    if (!seen[id]) fail("chunk pool: chunk {} is neither idle, unborn nor owned", id);
  }
  if (created != num_created_ || mapped != num_mapped_)
    fail("chunk pool: counters disagree ({} created, {} mapped)", created, mapped);
  for (std::size_t o = 1; o < kNumChunkOwners; ++o) {
    if (owned[o] != owned_[o]) fail("chunk pool: owner {} holds {} chunks, counter says {}", o, owned[o], owned_[o]);
    if (owned_[o] > quota_[o]) fail("chunk pool: owner {} holds {} chunks over its quota {}", o, owned_[o], quota_[o]);
  }
  for (std::size_t k = 1; k < ranges_.size(); ++k)
    if (ranges_[k - 1].base + ranges_[k - 1].bytes > ranges_[k].base)
      fail("chunk pool: ranges {} and {} overlap", k - 1, k);
}

}  // namespace kvmm
