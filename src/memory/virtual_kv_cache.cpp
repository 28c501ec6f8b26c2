#include "kvmm/memory/virtual_kv_cache.hpp"

#include "kvmm/error.hpp"

#include <algorithm>
#include <chrono>

namespace kvmm {

VirtualKVCache::VirtualKVCache(ChunkPool& pool, const VirtualKVCacheOptions& options) : pool_(pool), options_(options) {
  const auto& o = options_;
  if (o.num_layers == 0) fail("num_layers = {}: must be positive", o.num_layers);
  if (o.max_batch == 0 || o.max_batch >= kNoSlot) fail("max_batch = {}: must be positive", o.max_batch);
  if (o.max_context == 0) fail("max_context = {}: must be positive", o.max_context);
  if (o.kv_heads == 0) fail("kv_heads = {}: must be positive", o.kv_heads);
  if (o.head_dim == 0) fail("head_dim = {}: must be positive", o.head_dim);
  if (o.dtype_bytes == 0) fail("dtype_bytes = {}: must be positive", o.dtype_bytes);
  const std::uint64_t chunk = pool.chunk_bytes();
  if (o.page_group_bytes == 0 || o.page_group_bytes % chunk != 0)
    fail("page_group_bytes = {}: must be a positive multiple of the chunk size {}", o.page_group_bytes, chunk);
  if (o.eager_tokens > o.max_context) fail("eager_tokens = {}: above max_context {}", o.eager_tokens, o.max_context);
  if (o.prefetch_tokens == 0) fail("prefetch_tokens = {}: must be at least 1 (the next step's token)", o.prefetch_tokens);
  const std::uint64_t head_bytes = std::uint64_t{o.kv_heads} * o.head_dim * o.dtype_bytes;
  num_tensors_ = o.layout == TensorLayout::kPerLayer ? 2 * o.num_layers : 2;
  token_bytes_ = o.layout == TensorLayout::kPerLayer ? head_bytes : head_bytes * o.num_layers;
  groups_per_slot_ = groups_for(o.max_context);
  chunks_per_group_ = static_cast<std::uint32_t>(o.page_group_bytes / chunk);
  slot_bytes_ = std::uint64_t{groups_per_slot_} * o.page_group_bytes;
  tensor_bytes_ = slot_bytes_ * o.max_batch;
  const std::uint64_t total = tensor_bytes_ * num_tensors_;
  if (total / num_tensors_ / o.max_batch != slot_bytes_) fail("max_context = {}: virtual size overflows", o.max_context);
  if (!pool_.reserve(total, &range_)) fail("max_batch = {}: cannot reserve {} bytes of address space", o.max_batch, total);

  active_.assign(o.max_batch, 0);
  backed_ = std::make_unique<std::atomic<std::uint32_t>[]>(o.max_batch);
  want_ = std::make_unique<std::atomic<std::uint32_t>[]>(o.max_batch);
  capacity_ = std::make_unique<std::atomic<std::uint32_t>[]>(o.max_batch);
  for (std::uint32_t s = 0; s < o.max_batch; ++s) {
    backed_[s].store(0, std::memory_order_relaxed);
    capacity_[s].store(0, std::memory_order_relaxed);
    want_[s].store(0, std::memory_order_relaxed);
  }
  table_.assign(std::size_t{o.max_batch} * groups_per_slot_ * num_tensors_ * chunks_per_group_, kNoChunk);
  missing_slots_.reserve(o.max_batch);
  missing_targets_.reserve(o.max_batch);
  ring_.assign(o.max_batch, 0);
  queued_.assign(o.max_batch, 0);
  if (o.background_mapper) mapper_ = std::thread([this] { mapper_loop(); });
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
  std::lock_guard lock(state_mutex_);
  for (std::uint32_t s = 0; s < options_.max_batch; ++s) shrink_locked(s, 0);
  pool_.free_range(range_);
}

TensorView VirtualKVCache::view(std::uint32_t layer, std::uint32_t kv) const {
  if (layer >= options_.num_layers) fail("layer = {}: model has {} layers", layer, options_.num_layers);
  const std::uint64_t head_bytes = token_bytes_ / (options_.layout == TensorLayout::kPerLayer ? 1 : options_.num_layers);
  if (options_.layout == TensorLayout::kPerLayer)
    return TensorView{range_.base + (2 * std::uint64_t{layer} + kv) * tensor_bytes_, slot_bytes_, token_bytes_};
  return TensorView{range_.base + kv * tensor_bytes_ + layer * head_bytes, slot_bytes_, token_bytes_};
}

std::uint64_t VirtualKVCache::chunk_address(std::uint32_t t, std::uint32_t slot, std::uint32_t g, std::uint32_t i) const {
  return range_.base + t * tensor_bytes_ + slot * slot_bytes_ + g * options_.page_group_bytes + i * pool_.chunk_bytes();
}

// Publishes a slot's backing: groups for the mapper and tests, and the token capacity
// that step() compares against (no division on the fast path).
void VirtualKVCache::publish(std::uint32_t slot, std::uint32_t groups) {
  const std::uint64_t cap = std::uint64_t{groups} * options_.page_group_bytes / token_bytes_;
  capacity_[slot].store(static_cast<std::uint32_t>(std::min<std::uint64_t>(cap, options_.max_context)), std::memory_order_release);
  backed_[slot].store(groups, std::memory_order_release);
}

bool VirtualKVCache::grow_locked(std::span<const std::uint32_t> slots, std::span<const std::uint32_t> targets) {
  addrs_.clear();
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const std::uint32_t s = slots[k], from = backed_[s].load(std::memory_order_relaxed);
    for (std::uint32_t t = 0; t < num_tensors_; ++t)
      for (std::uint32_t g = from; g < targets[k]; ++g)
        for (std::uint32_t i = 0; i < chunks_per_group_; ++i) addrs_.push_back(chunk_address(t, s, g, i));
  }
  if (addrs_.empty()) return true;
  ids_.resize(addrs_.size());
  if (!pool_.map_batch(ChunkOwner::kVirtualTensor, addrs_, ids_)) return false;
  std::size_t n = 0;
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const std::uint32_t s = slots[k], from = backed_[s].load(std::memory_order_relaxed);
    for (std::uint32_t t = 0; t < num_tensors_; ++t)
      for (std::uint32_t g = from; g < targets[k]; ++g)
        for (std::uint32_t i = 0; i < chunks_per_group_; ++i) table(s, g, t, i) = ids_[n++];
    publish(s, std::max(from, targets[k]));
  }
  return true;
}

void VirtualKVCache::shrink_locked(std::uint32_t slot, std::uint32_t to_groups) {
  const std::uint32_t from = backed_[slot].load(std::memory_order_relaxed);
  if (to_groups >= from) return;
  ids_.clear();
  // Tensor-major order, so each tensor's groups form one contiguous run to unmap.
  for (std::uint32_t t = 0; t < num_tensors_; ++t)
    for (std::uint32_t g = to_groups; g < from; ++g)
      for (std::uint32_t i = 0; i < chunks_per_group_; ++i) {
        ids_.push_back(table(slot, g, t, i));
        table(slot, g, t, i) = kNoChunk;
      }
  pool_.unmap_batch(ids_);
  publish(slot, to_groups);
  reclaimed_groups_.fetch_add(from - to_groups, std::memory_order_relaxed);
}

bool VirtualKVCache::reclaim_locked(std::uint32_t chunks, std::uint32_t keep, bool only_if_enough) {
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
      if (active_[s] || backed_[s].load(std::memory_order_relaxed) == 0) continue;
      if ((s == keep) != (pass == 1)) continue;
      shrink_locked(s, 0);
      have = pool_.available(ChunkOwner::kVirtualTensor);
    }
  }
  return have >= chunks;
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
  for (std::uint32_t s = 0; s < options_.max_batch; ++s)
    if (!active_[s]) n += std::uint64_t{backed_[s].load(std::memory_order_relaxed)} * num_tensors_ * chunks_per_group_;
  return static_cast<std::uint32_t>(n);
}

std::uint32_t VirtualKVCache::reclaim(std::uint32_t chunks) {
  std::lock_guard lock(state_mutex_);
  const std::uint64_t per_group = std::uint64_t{num_tensors_} * chunks_per_group_;
  std::uint64_t done = 0;
  for (int pass = 0; pass < 2 && done < chunks; ++pass)
    for (std::uint32_t s = 0; s < options_.max_batch && done < chunks; ++s) {
      if (active_[s] || backed_[s].load(std::memory_order_relaxed) == 0 || (s == spare_) != (pass == 1)) continue;
      done += backed_[s].load(std::memory_order_relaxed) * per_group;
      shrink_locked(s, 0);
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

bool VirtualKVCache::step(std::span<const std::uint32_t> seq_lens) {
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
      const auto need = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunks, pool_.capacity() + std::uint64_t{1}));
      if (!reclaim_locked(need, spare_, true) || !grow_locked(missing_slots_, missing_targets_)) {
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
    if (item == kHousekeeping) {
      housekeeping();
    } else {
      std::lock_guard state(state_mutex_);
      const std::uint32_t want = want_[item].load(std::memory_order_relaxed);
      const std::uint32_t have = backed_[item].load(std::memory_order_relaxed);
      // Best effort: a failed pre-map leaves the work to step(), which reports it.
      if (active_[item] && want > have && grow_locked(std::span<const std::uint32_t>(&item, 1), std::span<const std::uint32_t>(&want, 1)))
        background_groups_.fetch_add(want - have, std::memory_order_relaxed);
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
      const std::uint32_t want = groups_for(options_.eager_tokens), have = backed_[spare_].load(std::memory_order_relaxed);
      if (want > have && grow_locked(std::span<const std::uint32_t>(&spare_, 1), std::span<const std::uint32_t>(&want, 1)))
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
  return s;
}

void VirtualKVCache::check_invariants() const {
  std::lock_guard lock(state_mutex_);
  std::uint64_t chunks = 0;
  for (std::uint32_t s = 0; s < options_.max_batch; ++s) {
    const std::uint32_t b = backed_[s].load(std::memory_order_relaxed);
    if (b > groups_per_slot_) fail("virtual kv cache: slot {} backs {} groups of {}", s, b, groups_per_slot_);
    for (std::uint32_t g = 0; g < groups_per_slot_; ++g)
      for (std::uint32_t t = 0; t < num_tensors_; ++t)
        for (std::uint32_t i = 0; i < chunks_per_group_; ++i) {
          const ChunkId id =
              table_[((std::size_t{s} * groups_per_slot_ + g) * num_tensors_ + t) * chunks_per_group_ + i];
          if (g >= b) {
            if (id != kNoChunk) fail("virtual kv cache: slot {} group {} is past the backing but holds chunk {}", s, g, id);
            continue;
          }
          if (id == kNoChunk) fail("virtual kv cache: slot {} group {} tensor {} has no chunk", s, g, t);
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
