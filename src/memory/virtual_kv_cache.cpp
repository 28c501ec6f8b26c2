#include "kvmm/memory/virtual_kv_cache.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <algorithm>
#include <chrono>

namespace kvmm {

VirtualKVCache::VirtualKVCache(ChunkPool& pool, const VirtualKVCacheOptions& options) : pool_(pool), options_(options) {
  const auto& o = options_;
  if (o.num_layers == 0) fail("num_layers = {}: must be positive", o.num_layers);
  if (o.max_batch == 0 || o.max_batch >= kNoSlot) fail("max_batch = {}: must be in [1, 2^32-1)", o.max_batch);
  if (o.max_context == 0) fail("max_context = {}: must be positive", o.max_context);
  if (o.kv_heads == 0) fail("kv_heads = {}: must be positive", o.kv_heads);
  if (o.head_dim == 0) fail("head_dim = {}: must be positive", o.head_dim);
  if (o.dtype_bytes == 0) fail("dtype_bytes = {}: must be positive", o.dtype_bytes);
  if (o.layout != TensorLayout::kPerLayer && o.layout != TensorLayout::kSliced)
    fail("layout = {}: not a TensorLayout", static_cast<int>(o.layout));
  const std::uint64_t chunk = pool.chunk_bytes();
  if (o.page_group_bytes == 0 || o.page_group_bytes % chunk != 0)
    fail("page_group_bytes = {}: must be a positive multiple of the chunk size {}", o.page_group_bytes, chunk);
  if (o.page_group_bytes / chunk >= kNoChunk)
    fail("page_group_bytes = {}: more than 2^32-2 chunks", o.page_group_bytes);
  if (o.eager_tokens > o.max_context) fail("eager_tokens = {}: above max_context {}", o.eager_tokens, o.max_context);
  if (o.prefetch_tokens == 0)
    fail("prefetch_tokens = {}: must be at least 1 (the next step's token)", o.prefetch_tokens);
  // Every size product checked, each message naming the fields that overflow.
  const std::uint64_t head_bytes = checked_mul(checked_mul(o.kv_heads, o.head_dim, "kv_heads * head_dim"),
                                               o.dtype_bytes, "kv_heads * head_dim * dtype_bytes");
  if (o.layout == TensorLayout::kPerLayer && o.num_layers > (kNoSlot >> 1))
    fail("num_layers = {}: 2 * num_layers tensors overflow 32 bits", o.num_layers);
  num_tensors_ = o.layout == TensorLayout::kPerLayer ? 2 * o.num_layers : 2;
  token_bytes_ = o.layout == TensorLayout::kPerLayer
                     ? head_bytes
                     : checked_mul(head_bytes, o.num_layers, "num_layers * kv_heads * head_dim * dtype_bytes");
  const std::uint64_t groups =
      ceil_div(checked_mul(o.max_context, token_bytes_, "max_context * token bytes"), o.page_group_bytes);
  if (groups >= kNoSlot)
    fail("max_context = {}: {} page groups of {} bytes per slot, more than 2^32-2", o.max_context, groups,
         o.page_group_bytes);
  groups_per_slot_ = static_cast<std::uint32_t>(groups);
  chunks_per_group_ = static_cast<std::uint32_t>(o.page_group_bytes / chunk);
  slot_bytes_ = checked_mul(groups_per_slot_, o.page_group_bytes, "max_context rounded up to whole page groups");
  tensor_bytes_ = checked_mul(slot_bytes_, o.max_batch, "max_batch * slot bytes");
  const std::uint64_t total = checked_mul(tensor_bytes_, num_tensors_, "tensors * max_batch * slot bytes");
  const std::uint64_t table_entries = total / chunk;
  if (table_entries >= kNoChunk)
    fail("max_batch = {}, max_context = {}: the virtual tensors span {} chunks, more than 2^32-2", o.max_batch,
         o.max_context, table_entries);

  // Host memory first, then the address space, the mapper thread last: a failure
  // leaves nothing behind.
  active_.assign(o.max_batch, 0);
  backed_ = std::make_unique<std::atomic<std::uint32_t>[]>(o.max_batch);
  want_ = std::make_unique<std::atomic<std::uint32_t>[]>(o.max_batch);
  capacity_ = std::make_unique<std::atomic<std::uint32_t>[]>(o.max_batch);
  for (std::uint32_t s = 0; s < o.max_batch; ++s) {
    backed_[s].store(0, std::memory_order_relaxed);
    capacity_[s].store(0, std::memory_order_relaxed);
    want_[s].store(0, std::memory_order_relaxed);
  }
  table_.assign(table_entries, kNoChunk);
  extent_.assign(o.max_batch, 0);
  missing_slots_.reserve(o.max_batch);
  missing_targets_.reserve(o.max_batch);
  victim_slots_.reserve(o.max_batch);
  victim_groups_.reserve(o.max_batch);
  ring_.assign(o.max_batch, 0);
  queued_.assign(o.max_batch, 0);
  if (!pool_.reserve(total, &range_))
    fail("max_batch = {}: cannot reserve {} bytes of address space", o.max_batch, total);
  if (!o.background_mapper) return;
  try {
    mapper_ = std::thread([this] { mapper_loop(); });
  } catch (...) {
    pool_.free_range(range_);
    throw;
  }
}

VirtualKVCache::~VirtualKVCache() {
  if (mapper_.joinable()) {
    {
      std::lock_guard lock(queue_mutex_);
      stop_ = true;
    }
    queue_cv_.notify_all();
    mapper_.join();
  }
  // A destructor cannot raise: chunks the backend fails to unmap stay with the pool,
  // which releases them when it goes.
  std::lock_guard lock(state_mutex_);
  for (std::uint32_t s = 0; s < options_.max_batch; ++s) {
    try {
      shrink_locked(s, 0);
    } catch (...) {
    }
  }
  try {
    pool_.free_range(range_);
  } catch (...) {
  }
}

TensorView VirtualKVCache::view(std::uint32_t layer, std::uint32_t kv) const {
  if (layer >= options_.num_layers) fail("layer = {}: model has {} layers", layer, options_.num_layers);
  const std::uint64_t head_bytes =
      token_bytes_ / (options_.layout == TensorLayout::kPerLayer ? 1 : options_.num_layers);
  if (options_.layout == TensorLayout::kPerLayer)
    return TensorView{range_.base + (2 * std::uint64_t{layer} + kv) * tensor_bytes_, slot_bytes_, token_bytes_};
  return TensorView{range_.base + kv * tensor_bytes_ + layer * head_bytes, slot_bytes_, token_bytes_};
}

std::uint64_t VirtualKVCache::chunk_address(std::uint32_t t, std::uint32_t slot, std::uint32_t g,
                                            std::uint32_t i) const {
  return range_.base + t * tensor_bytes_ + slot * slot_bytes_ + g * options_.page_group_bytes + i * pool_.chunk_bytes();
}

// Publishes a slot's backing: groups for the mapper and tests, and the token capacity
// that step() compares against (no division on the fast path).
void VirtualKVCache::publish(std::uint32_t slot, std::uint32_t groups) {
  const std::uint64_t cap = std::uint64_t{groups} * options_.page_group_bytes / token_bytes_;
  capacity_[slot].store(static_cast<std::uint32_t>(std::min<std::uint64_t>(cap, options_.max_context)),
                        std::memory_order_release);
  backed_[slot].store(groups, std::memory_order_release);
}

bool VirtualKVCache::grow_locked(std::span<const std::uint32_t> slots, std::span<const std::uint32_t> targets) {
  addrs_.clear();
  // Chunks left above the backing by a failed unmap (strays) are kept, not mapped again.
  auto for_missing = [&](auto&& fn) {
    for (std::size_t k = 0; k < slots.size(); ++k) {
      const std::uint32_t s = slots[k], from = backed_[s].load(std::memory_order_relaxed);
      for (std::uint32_t t = 0; t < num_tensors_; ++t)
        for (std::uint32_t g = from; g < targets[k]; ++g)
          for (std::uint32_t i = 0; i < chunks_per_group_; ++i)
            if (table(s, g, t, i) == kNoChunk) fn(s, g, t, i);
    }
  };
  for_missing([&](std::uint32_t s, std::uint32_t g, std::uint32_t t, std::uint32_t i) {
    addrs_.push_back(chunk_address(t, s, g, i));
  });
  if (!addrs_.empty()) {
    ids_.resize(addrs_.size());
    if (!pool_.map_batch(ChunkOwner::kVirtualTensor, addrs_, ids_)) return false;
    std::size_t n = 0;
    for_missing(
        [&](std::uint32_t s, std::uint32_t g, std::uint32_t t, std::uint32_t i) { table(s, g, t, i) = ids_[n++]; });
  }
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const std::uint32_t s = slots[k];
    if (targets[k] <= backed_[s].load(std::memory_order_relaxed)) continue;
    extent_[s] = std::max(extent_[s], targets[k]);
    publish(s, targets[k]);
  }
  return true;
}

std::uint32_t VirtualKVCache::shrink_locked(std::uint32_t slot, std::uint32_t to_groups) {
  const std::uint32_t backed = backed_[slot].load(std::memory_order_relaxed), from = extent_[slot];
  if (to_groups >= from) return 0;
  ids_.clear();
  where_.clear();
  addrs_.clear();
  // Tensor-major order, so each tensor's groups form one contiguous run to unmap.
  for (std::uint32_t t = 0; t < num_tensors_; ++t)
    for (std::uint32_t g = to_groups; g < from; ++g)
      for (std::uint32_t i = 0; i < chunks_per_group_; ++i) {
        ChunkId& id = table(slot, g, t, i);
        if (id == kNoChunk) continue;
        ids_.push_back(id);
        where_.push_back(static_cast<std::size_t>(&id - table_.data()));
        addrs_.push_back(chunk_address(t, slot, g, i));
      }
  try {
    pool_.unmap_batch(ids_);
  } catch (...) {
    // The backend raised part way: forget exactly the chunks no longer mapped here (an
    // unmapped one may already serve another pool user). The backing drops to
    // `to_groups` if anything went; chunks left above it are strays.
    bool any = false;
    for (std::size_t k = 0; k < ids_.size(); ++k)
      if (pool_.address(ids_[k]) != addrs_[k]) table_[where_[k]] = kNoChunk, any = true;
    if (any && backed > to_groups) {
      publish(slot, to_groups);
      reclaimed_groups_.fetch_add(backed - to_groups, std::memory_order_relaxed);
    }
    throw;
  }
  for (std::size_t w : where_) table_[w] = kNoChunk;
  extent_[slot] = to_groups;
  if (backed > to_groups) {
    publish(slot, to_groups);
    reclaimed_groups_.fetch_add(backed - to_groups, std::memory_order_relaxed);
  }
  return static_cast<std::uint32_t>(ids_.size());
}

bool VirtualKVCache::reclaim_locked(std::uint32_t chunks, std::uint32_t keep, bool only_if_enough, bool record) {
  std::uint32_t have = pool_.available(ChunkOwner::kVirtualTensor);
  if (have >= chunks) return true;
  const std::uint64_t per_group = std::uint64_t{num_tensors_} * chunks_per_group_;
  if (only_if_enough) {
    std::uint64_t reclaimable = 0;
    for (std::uint32_t s = 0; s < options_.max_batch; ++s)
      if (!active_[s]) reclaimable += backed_[s].load(std::memory_order_relaxed) * per_group;
    if (have + reclaimable < chunks) return false;
  }
  // Spare slot last: it is the next request's memory.
  for (int pass = 0; pass < 2 && have < chunks; ++pass) {
    for (std::uint32_t s = 0; s < options_.max_batch && have < chunks; ++s) {
      const std::uint32_t b = backed_[s].load(std::memory_order_relaxed);
      if (active_[s] || (b == 0 && extent_[s] == 0)) continue;
      if ((s == keep) != (pass == 1)) continue;
      if (record && b > 0) {
        victim_slots_.push_back(s);  // reserved for max_batch: no allocation
        victim_groups_.push_back(b);
      }
      shrink_locked(s, 0);
      have = pool_.available(ChunkOwner::kVirtualTensor);
    }
  }
  return have >= chunks;
}

void VirtualKVCache::restore_victims_locked() {
  if (victim_slots_.empty()) return;
  try {
    // Only the groups that come back leave the reclaimed count (a slot whose unmap
    // raised before anything went was never counted).
    std::uint64_t before = 0, after = 0;
    for (std::uint32_t s : victim_slots_) before += backed_[s].load(std::memory_order_relaxed);
    if (grow_locked(victim_slots_, victim_groups_)) {
      for (std::uint32_t s : victim_slots_) after += backed_[s].load(std::memory_order_relaxed);
      reclaimed_groups_.fetch_sub(after - before, std::memory_order_relaxed);
    }
  } catch (...) {
    // A second failure: those slots keep less cached; nothing else is affected.
  }
  victim_slots_.clear();
  victim_groups_.clear();
}

// Reclaims cached chunks of inactive slots if the pool is short, then maps the missing
// groups in one transaction. Any failure maps the reclaimed chunks back first, so a
// failing step leaves every slot's backing as it was.
bool VirtualKVCache::grow_or_restore_locked(std::uint64_t chunks) {
  const auto need = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunks, pool_.capacity() + std::uint64_t{1}));
  victim_slots_.clear();
  victim_groups_.clear();
  bool ok = false;
  try {
    ok = reclaim_locked(need, spare_, true, true) && grow_locked(missing_slots_, missing_targets_);
  } catch (...) {
    restore_victims_locked();
    throw;
  }
  if (!ok) restore_victims_locked();
  victim_slots_.clear();
  victim_groups_.clear();
  return ok;
}

std::optional<std::uint32_t> VirtualKVCache::alloc_reqid() {
  std::uint32_t slot = kNoSlot;
  {
    std::lock_guard lock(state_mutex_);
    if (spare_ != kNoSlot && !active_[spare_]) {
      slot = spare_;
    } else {
      std::uint32_t best = 0;
      for (std::uint32_t s = 0; s < options_.max_batch; ++s) {
        if (active_[s]) continue;
        const std::uint32_t b = backed_[s].load(std::memory_order_relaxed);
        if (slot == kNoSlot || b > best) slot = s, best = b;
      }
    }
    if (slot == kNoSlot) return std::nullopt;
    active_[slot] = 1;
    spare_ = kNoSlot;
  }
  if (mapper_.joinable()) enqueue(kHousekeeping);
  return slot;
}

void VirtualKVCache::free_reqid(std::uint32_t slot) {
  {
    std::lock_guard lock(state_mutex_);
    if (slot >= options_.max_batch) fail("slot = {}: max_batch is {}", slot, options_.max_batch);
    if (!active_[slot]) fail("slot = {}: not active (double free_reqid?)", slot);
    active_[slot] = 0;
    want_[slot].store(0, std::memory_order_relaxed);
  }
  if (mapper_.joinable()) enqueue(kHousekeeping);
}

std::uint32_t VirtualKVCache::reclaimable_chunks() const {
  std::lock_guard lock(state_mutex_);
  std::uint64_t n = 0;
  for (std::uint32_t s = 0; s < options_.max_batch; ++s) {
    if (active_[s]) continue;
    const std::uint32_t b = backed_[s].load(std::memory_order_relaxed);
    n += std::uint64_t{b} * num_tensors_ * chunks_per_group_;
    // Strays above the backing (only after a backend raised on an unmap) count too.
    for (std::uint32_t g = b; g < extent_[s]; ++g)
      for (std::uint32_t t = 0; t < num_tensors_; ++t)
        for (std::uint32_t i = 0; i < chunks_per_group_; ++i) n += table_[index(s, g, t, i)] != kNoChunk;
  }
  return static_cast<std::uint32_t>(n);
}

std::uint32_t VirtualKVCache::reclaim(std::uint32_t chunks) {
  std::lock_guard lock(state_mutex_);
  std::uint64_t done = 0;
  for (int pass = 0; pass < 2 && done < chunks; ++pass)
    for (std::uint32_t s = 0; s < options_.max_batch && done < chunks; ++s) {
      if (active_[s] || extent_[s] == 0 || (s == spare_) != (pass == 1)) continue;
      done += shrink_locked(s, 0);
    }
  return static_cast<std::uint32_t>(done);
}

bool VirtualKVCache::active(std::uint32_t slot) const {
  if (slot >= options_.max_batch) fail("slot = {}: max_batch is {}", slot, options_.max_batch);
  std::lock_guard lock(state_mutex_);
  return active_[slot] != 0;
}

std::uint32_t VirtualKVCache::backed_groups(std::uint32_t slot) const {
  if (slot >= options_.max_batch) fail("slot = {}: max_batch is {}", slot, options_.max_batch);
  return backed_[slot].load(std::memory_order_acquire);
}

// Long by design (lint): vAttention's step in its order (reclaim, grow, map) with one rollback; split, the rollback
// NOLINTBEGIN(readability-function-cognitive-complexity)
// would be scattered.
bool VirtualKVCache::step(std::span<const std::uint32_t> seq_lens) {
  // NOLINTEND(readability-function-cognitive-complexity)
  const std::uint32_t B = options_.max_batch;
  if (seq_lens.size() != B) fail("seq_lens.size() = {}: must be max_batch = {}", seq_lens.size(), B);
  // active_ is written only by this (the scheduler) thread, so reading it unlocked is safe.
  bool missing = false;
  for (std::uint32_t s = 0; s < B; ++s) {
    const std::uint32_t len = seq_lens[s];
    if (len == 0) continue;
    if (len > options_.max_context) fail("seq_lens[{}] = {}: above max_context {}", s, len, options_.max_context);
    if (!active_[s]) fail("seq_lens[{}] = {}: slot is not active", s, len);
    missing |= capacity_[s].load(std::memory_order_acquire) < len;
  }
  steps_.fetch_add(1, std::memory_order_relaxed);
  if (missing) {
    // Waits at most for the mapper's unit in flight, then maps the rest here.
    std::lock_guard lock(state_mutex_);
    missing_slots_.clear();
    missing_targets_.clear();
    std::uint64_t chunks = 0;
    for (std::uint32_t s = 0; s < B; ++s) {
      const std::uint32_t need = groups_for(seq_lens[s]), have = backed_[s].load(std::memory_order_relaxed);
      if (seq_lens[s] == 0 || have >= need) continue;
      missing_slots_.push_back(s);
      missing_targets_.push_back(need);
      chunks += std::uint64_t{need - have} * num_tensors_ * chunks_per_group_;
    }
    if (!missing_slots_.empty()) {
      sync_steps_.fetch_add(1, std::memory_order_relaxed);
      bool ok = false;
      try {
        ok = grow_or_restore_locked(chunks);
      } catch (...) {
        failed_steps_.fetch_add(1, std::memory_order_relaxed);
        throw;
      }
      if (!ok) {
        failed_steps_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      sync_groups_.fetch_add(chunks / (std::uint64_t{num_tensors_} * chunks_per_group_), std::memory_order_relaxed);
    }
  }
  if (mapper_.joinable()) {
    // Speculative pre-mapping: every running request holds one more token per step;
    // back prefetch_tokens ahead. One queue lock (and no wake-up while the mapper
    // polls) for the whole batch.
    std::unique_lock lock(queue_mutex_, std::defer_lock);
    const std::uint32_t ahead = options_.prefetch_tokens;
    for (std::uint32_t s = 0; s < B; ++s) {
      const std::uint32_t len = seq_lens[s];
      if (len == 0 || len >= options_.max_context) continue;
      const std::uint32_t next = std::min(options_.max_context - len, ahead) + len;
      if (next > capacity_[s].load(std::memory_order_acquire)) {
        want_[s].store(groups_for(next), std::memory_order_relaxed);
        if (!lock.owns_lock()) lock.lock();
        push_locked(s);
      }
    }
    if (lock.owns_lock()) {
      const bool wake = sleeping_;  // a polling mapper finds the work by itself
      lock.unlock();
      if (wake) queue_cv_.notify_one();
    }
  }
  return true;
}

void VirtualKVCache::push_locked(std::uint32_t item) {
  if (item == kHousekeeping) {
    housekeeping_queued_ = true;
  } else if (!queued_[item]) {
    queued_[item] = 1;
    ring_[(head_ + count_++) % ring_.size()] = item;
  }
}

void VirtualKVCache::enqueue(std::uint32_t item) {
  {
    std::lock_guard lock(queue_mutex_);
    push_locked(item);
  }
  queue_cv_.notify_one();
}

void VirtualKVCache::mapper_loop() {
  std::unique_lock lock(queue_mutex_);
  auto ready = [&] { return stop_ || count_ > 0 || housekeeping_queued_; };
  auto last_work = std::chrono::steady_clock::now();
  const auto poll = std::chrono::microseconds(options_.mapper_poll_us);
  for (;;) {
    // While steps keep coming, poll instead of blocking: step() then queues work without
    // a wake-up (a cross-CPU wake costs microseconds, far more on a VM). After a second
    // without work, block until someone wakes us.
    while (!ready()) {
      if (poll.count() > 0 && std::chrono::steady_clock::now() - last_work < std::chrono::seconds(1)) {
        queue_cv_.wait_for(lock, poll, ready);
      } else {
        sleeping_ = true;
        queue_cv_.wait(lock, ready);
        sleeping_ = false;
      }
    }
    if (stop_) break;
    last_work = std::chrono::steady_clock::now();
    std::uint32_t item = kHousekeeping;
    if (count_ > 0) {
      item = ring_[head_];
      head_ = (head_ + 1) % ring_.size();
      --count_;
      queued_[item] = 0;
    } else {
      housekeeping_queued_ = false;
    }
    busy_ = true;
    lock.unlock();
    // Best effort: a failed pre-map (false or a backend exception) leaves the work to
    // step(), which reports it; an exception must not leave this thread.
    try {
      if (item == kHousekeeping) {
        housekeeping();
      } else {
        std::lock_guard state(state_mutex_);
        const std::uint32_t want = want_[item].load(std::memory_order_relaxed);
        const std::uint32_t have = backed_[item].load(std::memory_order_relaxed);
        if (active_[item] && want > have &&
            grow_locked(std::span<const std::uint32_t>(&item, 1), std::span<const std::uint32_t>(&want, 1)))
          background_groups_.fetch_add(want - have, std::memory_order_relaxed);
      }
    } catch (...) {
      background_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    lock.lock();
    busy_ = false;
    if (count_ == 0 && !housekeeping_queued_) idle_cv_.notify_all();
  }
  busy_ = false;
  idle_cv_.notify_all();
}

// Eager allocation of a spare slot and threshold-driven deferred reclamation (§6.1.2).
void VirtualKVCache::housekeeping() {
  std::lock_guard state(state_mutex_);
  if (options_.eager_tokens > 0) {
    if (spare_ == kNoSlot || active_[spare_]) {
      spare_ = kNoSlot;
      std::uint32_t best = 0;
      for (std::uint32_t s = 0; s < options_.max_batch; ++s) {
        if (active_[s]) continue;
        const std::uint32_t b = backed_[s].load(std::memory_order_relaxed);
        if (spare_ == kNoSlot || b > best) spare_ = s, best = b;
      }
    }
    if (spare_ != kNoSlot) {
      const std::uint32_t want = groups_for(options_.eager_tokens),
                          have = backed_[spare_].load(std::memory_order_relaxed);
      if (want > have &&
          grow_locked(std::span<const std::uint32_t>(&spare_, 1), std::span<const std::uint32_t>(&want, 1)))
        background_groups_.fetch_add(want - have, std::memory_order_relaxed);
    }
  }
  if (options_.reclaim_below_chunks > 0) reclaim_locked(options_.reclaim_below_chunks, spare_, false);
}

void VirtualKVCache::wait_idle() {
  if (!mapper_.joinable()) return;
  std::unique_lock lock(queue_mutex_);
  idle_cv_.wait(lock, [&] { return stop_ || (count_ == 0 && !housekeeping_queued_ && !busy_); });
}

VirtualKVCacheStats VirtualKVCache::stats() const {
  VirtualKVCacheStats s;
  s.steps = steps_.load();
  s.sync_steps = sync_steps_.load();
  s.sync_groups = sync_groups_.load();
  s.background_groups = background_groups_.load();
  s.reclaimed_groups = reclaimed_groups_.load();
  s.failed_steps = failed_steps_.load();
  s.background_errors = background_errors_.load();
  return s;
}

void VirtualKVCache::check_invariants() const {
  std::lock_guard lock(state_mutex_);
  std::uint64_t chunks = 0;
  for (std::uint32_t s = 0; s < options_.max_batch; ++s) {
    const std::uint32_t b = backed_[s].load(std::memory_order_relaxed), e = extent_[s];
    if (b > groups_per_slot_ || e > groups_per_slot_ || e < b)
      fail("virtual kv cache: slot {} backs {} groups, extent {}, of {}", s, b, e, groups_per_slot_);
    const std::uint64_t cap =
        std::min<std::uint64_t>(std::uint64_t{b} * options_.page_group_bytes / token_bytes_, options_.max_context);
    if (capacity_[s].load(std::memory_order_relaxed) != cap)
      fail("virtual kv cache: slot {} publishes {} tokens for {} groups", s,
           capacity_[s].load(std::memory_order_relaxed), b);
    for (std::uint32_t g = 0; g < groups_per_slot_; ++g)
      for (std::uint32_t t = 0; t < num_tensors_; ++t)
        for (std::uint32_t i = 0; i < chunks_per_group_; ++i) {
          const ChunkId id =
              table_[((std::size_t{s} * groups_per_slot_ + g) * num_tensors_ + t) * chunks_per_group_ + i];
          if (id == kNoChunk) {
            if (g < b) fail("virtual kv cache: slot {} group {} tensor {} has no chunk", s, g, t);
            continue;
          }
          if (g >= e) fail("virtual kv cache: slot {} group {} is past the extent but holds chunk {}", s, g, id);
          if (pool_.owner(id) != ChunkOwner::kVirtualTensor || pool_.address(id) != chunk_address(t, s, g, i))
            fail("virtual kv cache: chunk {} of slot {} group {} is not mapped where the table says", id, s, g);
          ++chunks;
        }
  }
  if (spare_ != kNoSlot && active_[spare_]) fail("virtual kv cache: spare slot {} is active", spare_);
  if (chunks != pool_.owned(ChunkOwner::kVirtualTensor))
    fail("virtual kv cache: table holds {} chunks, pool says {} are owned by virtual tensors", chunks,
         pool_.owned(ChunkOwner::kVirtualTensor));
}

}  // namespace kvmm
