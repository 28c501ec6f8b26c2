#include "kvmm/memory/chunk_pool.hpp"

#include "kvmm/error.hpp"

#include <algorithm>

namespace kvmm {

const char* to_string(ChunkOwner owner) {
  switch (owner) {
    case ChunkOwner::kFree: return "free";
    case ChunkOwner::kKVArena: return "kv-arena";
    case ChunkOwner::kVirtualTensor: return "virtual-tensor";
    case ChunkOwner::kActivation: return "activation";
  }
  return "?";
}

namespace {
std::size_t idx(ChunkOwner o) { return static_cast<std::size_t>(o); }
}  // namespace

ChunkPool::ChunkPool(MemoryBackend& backend, const ChunkPoolOptions& options)
    : backend_(backend), chunk_bytes_(backend.chunk_bytes()) {
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
  if (!precreate(options.precreate_chunks)) {
    trim(0);
    fail("precreate_chunks = {}: the {} backend could not create them", options.precreate_chunks, backend_.name());
  }
}

ChunkPool::~ChunkPool() {
  std::lock_guard lock(mutex_);
  for (ChunkId id = 0; id < capacity(); ++id) {
    if (!created_[id]) continue;
    if (addr_[id] != 0) backend_.unmap(addr_[id], chunk_bytes_);
    backend_.release_chunk(handle_[id]);
  }
}

bool ChunkPool::reserve(std::uint64_t bytes, VirtualRange* out) {
  std::lock_guard lock(mutex_);
  ++backend_calls_;
  return backend_.reserve(bytes, out);
}

void ChunkPool::free_range(const VirtualRange& range) {
  std::lock_guard lock(mutex_);
  ++backend_calls_;
  backend_.free_range(range);
}

// Undoes a partial batch: unmaps the first `mapped` addresses, releases the chunks
// created for it and puts the idle ones back in their original stack order.
void ChunkPool::rollback(std::size_t from_idle, std::size_t created, std::size_t mapped,
                         std::span<const std::uint64_t> addrs) {
  std::size_t i = 0;
  while (i < mapped) {
    std::size_t j = i + 1;
    while (j < mapped && addrs[j] == addrs[j - 1] + chunk_bytes_) ++j;
    backend_.unmap(addrs[i], (j - i) * chunk_bytes_);
    ++backend_calls_;
    i = j;
  }
  for (std::size_t k = from_idle + created; k-- > from_idle;) {
    const ChunkId id = scratch_[k];
    backend_.release_chunk(handle_[id]);
    ++backend_calls_;
    created_[id] = 0;
    --num_created_;
    unborn_.push_back(id);
  }
  for (std::size_t k = from_idle; k-- > 0;) idle_.push_back(scratch_[k]);
  scratch_.clear();
}

bool ChunkPool::map_batch(ChunkOwner owner, std::span<const std::uint64_t> addrs, std::span<ChunkId> ids_out) {
  if (owner == ChunkOwner::kFree) fail("owner = {}: chunks are mapped for an owner", to_string(owner));
  if (ids_out.size() != addrs.size()) fail("ids_out.size() = {}: addrs has {}", ids_out.size(), addrs.size());
  for (std::uint64_t a : addrs)
    if (a == 0 || a % chunk_bytes_ != 0) fail("addrs: {:#x} is not a chunk-aligned address", a);
  std::lock_guard lock(mutex_);
  const std::size_t n = addrs.size();
  if (n == 0) return true;
  if (owned_[idx(owner)] + n > quota_[idx(owner)]) return false;
  if (idle_.size() + unborn_.size() < n) return false;
  scratch_.clear();
  // 1. Acquire: idle handles first (no backend call), then create.
  const std::size_t from_idle = std::min(n, idle_.size());
  for (std::size_t k = 0; k < from_idle; ++k) {
    scratch_.push_back(idle_.back());
    idle_.pop_back();
  }
  std::size_t created = 0;
  while (scratch_.size() < n) {
    const ChunkId id = unborn_.back();
    ++backend_calls_;
    if (!backend_.create_chunk(&handle_[id])) {
      rollback(from_idle, created, 0, addrs);
      return false;
    }
    unborn_.pop_back();
    created_[id] = 1;
    ++num_created_;
    scratch_.push_back(id);
    ++created;
  }
  // 2. Map every chunk.
  for (std::size_t k = 0; k < n; ++k) {
    ++backend_calls_;
    if (!backend_.map(handle_[scratch_[k]], addrs[k])) {
      rollback(from_idle, created, k, addrs);
      return false;
    }
  }
  // 3. Access once per contiguous run.
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i + 1;
    while (j < n && addrs[j] == addrs[j - 1] + chunk_bytes_) ++j;
    ++backend_calls_;
    if (!backend_.set_access(addrs[i], (j - i) * chunk_bytes_)) {
      rollback(from_idle, created, n, addrs);
      return false;
    }
    i = j;
  }
  // 4. Commit.
  for (std::size_t k = 0; k < n; ++k) {
    const ChunkId id = scratch_[k];
    owner_[id] = owner;
    addr_[id] = addrs[k];
    ids_out[k] = id;
  }
  owned_[idx(owner)] += static_cast<std::uint32_t>(n);
  num_mapped_ += static_cast<std::uint32_t>(n);
  scratch_.clear();
  return true;
}

void ChunkPool::unmap_batch(std::span<const ChunkId> ids) {
  std::lock_guard lock(mutex_);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const ChunkId id = check_id(ids[k]);
    if (addr_[id] == 0) fail("ids[{}] = {}: chunk is not mapped", k, id);
    for (std::size_t m = 0; m < k; ++m)
      if (ids[m] == id) fail("ids[{}] = {}: listed twice", k, id);
  }
  std::size_t i = 0;
  while (i < ids.size()) {
    std::size_t j = i + 1;
    while (j < ids.size() && addr_[ids[j]] == addr_[ids[j - 1]] + chunk_bytes_) ++j;
    ++backend_calls_;
    backend_.unmap(addr_[ids[i]], (j - i) * chunk_bytes_);
    i = j;
  }
  for (ChunkId id : ids) {
    --owned_[idx(owner_[id])];
    owner_[id] = ChunkOwner::kFree;
    addr_[id] = 0;
    idle_.push_back(id);
  }
  num_mapped_ -= static_cast<std::uint32_t>(ids.size());
}

void ChunkPool::set_quota(ChunkOwner owner, std::uint32_t quota) {
  if (owner == ChunkOwner::kFree) fail("owner = {}: has no quota", to_string(owner));
  std::lock_guard lock(mutex_);
  if (quota < owned_[idx(owner)]) fail("quota = {}: {} already holds {} chunks", quota, to_string(owner), owned_[idx(owner)]);
  quota_[idx(owner)] = quota;
}

std::uint32_t ChunkPool::quota(ChunkOwner owner) const {
  std::lock_guard lock(mutex_);
  return quota_[idx(owner)];
}

std::uint32_t ChunkPool::owned(ChunkOwner owner) const {
  std::lock_guard lock(mutex_);
  return owned_[idx(owner)];
}

bool ChunkPool::move_quota(ChunkOwner from, ChunkOwner to, std::uint32_t n) {
  if (from == ChunkOwner::kFree || to == ChunkOwner::kFree || from == to)
    fail("from = {}, to = {}: need two different owners", to_string(from), to_string(to));
  std::lock_guard lock(mutex_);
  if (quota_[idx(from)] - owned_[idx(from)] < n) return false;
  quota_[idx(from)] -= n;
  quota_[idx(to)] += n;
  return true;
}

std::uint32_t ChunkPool::available(ChunkOwner owner) const {
  std::lock_guard lock(mutex_);
  const std::uint32_t slack = quota_[idx(owner)] - owned_[idx(owner)];
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
    idle_.pop_back();
    ++backend_calls_;
    backend_.release_chunk(handle_[id]);
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
    if (owner_[id] != ChunkOwner::kFree) {
      if (!created_[id] || addr_[id] == 0 || seen[id]++) fail("chunk pool: owned chunk {} is not created and mapped", id);
      ++owned[idx(owner_[id])];
      ++mapped;
    }
    if (!seen[id]) fail("chunk pool: chunk {} is neither idle, unborn nor owned", id);
  }
  if (created != num_created_ || mapped != num_mapped_) fail("chunk pool: counters disagree ({} created, {} mapped)", created, mapped);
  for (std::size_t o = 1; o < kNumChunkOwners; ++o) {
    if (owned[o] != owned_[o]) fail("chunk pool: owner {} holds {} chunks, counter says {}", o, owned[o], owned_[o]);
    if (owned_[o] > quota_[o]) fail("chunk pool: owner {} holds {} chunks over its quota {}", o, owned_[o], quota_[o]);
  }
}

}  // namespace kvmm
