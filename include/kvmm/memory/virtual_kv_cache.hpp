// VirtualKVCache: vAttention's virtual KV tensors (§5, §6, §8.2): 2N tensors [B, L, H, D]
// (or sliced: one K and one V [B, L, N, H, D]); a request's slot is backed by page groups
// on demand. step(seq_lens) costs O(B) atomic loads when all is backed - the usual case,
// as a background mapper thread pre-maps the next steps, an eager spare slot and does
// reclamation; only what is still missing is mapped by the caller, in one transaction.
#pragma once

#include "kvmm/checked.hpp"
#include "kvmm/memory/chunk_pool.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

namespace kvmm {

enum class TensorLayout : std::uint8_t {
  kPerLayer,  // 2N tensors [B, L, H, D]: K of layer n is tensor 2n, V is 2n+1
  kSliced,    // 2 tensors [B, L, N, H, D]; a layer is a strided slice (§8.2)
};

struct VirtualKVCacheOptions {
  std::uint32_t num_layers = 0;   // N
  std::uint32_t max_batch = 0;    // B: number of slots
  std::uint32_t max_context = 0;  // L: tokens per slot
  std::uint32_t kv_heads = 0;     // H
  std::uint32_t head_dim = 0;     // D
  std::uint32_t dtype_bytes = 0;  // P
  // Physical growth unit of one tensor's slot: a multiple of the pool's chunk size.
  std::uint64_t page_group_bytes = std::uint64_t{2} << 20;
  TensorLayout layout = TensorLayout::kPerLayer;
  // Run the background mapper thread (otherwise step() maps synchronously).
  bool background_mapper = true;
  // While steps keep coming (within 1 s), the mapper polls its queue at this interval
  // instead of sleeping, so step() never pays a thread wake-up. 0: always sleep.
  std::uint32_t mapper_poll_us = 200;
  // After each step the mapper backs every running request up to len + prefetch_tokens
  // (1: just the next decode step; 8 gives a starved mapper several steps of slack at
  // the cost of mapping a page group a few tokens earlier).
  std::uint32_t prefetch_tokens = 8;
  // Tokens the mapper keeps backed in one inactive spare slot (0: no eager backing).
  std::uint32_t eager_tokens = 0;
  // The mapper unmaps cached chunks of inactive slots while fewer than this many chunks
  // are available to the cache (deferred reclamation, §6.1.2). 0: reclaim only when a
  // step is short of memory.
  std::uint32_t reclaim_below_chunks = 0;
};

// Address of (slot, token) in a layer's K or V tensor: base + slot * slot_stride +
// token * token_stride; the token's [H, D] elements follow contiguously.
struct TensorView {
  std::uint64_t base = 0;
  std::uint64_t slot_stride = 0;
  std::uint64_t token_stride = 0;
};

struct VirtualKVCacheStats {
  std::uint64_t steps = 0;
  std::uint64_t sync_steps = 0;         // steps that had to map on the calling thread
  std::uint64_t sync_groups = 0;        // page groups mapped by step() itself
  std::uint64_t background_groups = 0;  // page groups mapped by the mapper
  std::uint64_t reclaimed_groups = 0;   // page groups unmapped from inactive slots
  std::uint64_t failed_steps = 0;
  std::uint64_t background_errors = 0;  // mapper units whose backend call raised (left to step())
};

class VirtualKVCache {
 public:
  // vAttention init(N, B, L, H, D, P, page-group size). Raises kvmm::Error for a zero
  // dimension, a page group that is not a multiple of the chunk size, or sizes whose
  // products overflow (the message names the fields); nothing is left reserved.
  VirtualKVCache(ChunkPool& pool, const VirtualKVCacheOptions& options);
  // Stops the mapper, unmaps every chunk and frees the range.
  ~VirtualKVCache();
  VirtualKVCache(const VirtualKVCache&) = delete;
  VirtualKVCache& operator=(const VirtualKVCache&) = delete;

  const VirtualKVCacheOptions& options() const { return options_; }
  std::uint32_t num_tensors() const { return num_tensors_; }
  TensorView k(std::uint32_t layer) const { return view(layer, 0); }
  TensorView v(std::uint32_t layer) const { return view(layer, 1); }
  std::uint64_t token_bytes() const { return token_bytes_; }  // per token per tensor
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  std::uint32_t groups_per_slot() const { return groups_per_slot_; }
  std::uint32_t chunks_per_group() const { return chunks_per_group_; }
  // Page groups needed per tensor to hold `tokens` tokens (at most max_context).
  std::uint32_t groups_for(std::uint32_t tokens) const {
    if (tokens > options_.max_context) fail("tokens = {}: above max_context {}", tokens, options_.max_context);
    return static_cast<std::uint32_t>(ceil_div(std::uint64_t{tokens} * token_bytes_, options_.page_group_bytes));
  }

  // An unused slot, marked active: the eager spare if there is one, else the inactive
  // slot with the most backing (deferred reclamation). nullopt when all B are active.
  std::optional<std::uint32_t> alloc_reqid();
  // Marks the slot inactive; its chunks stay mapped for the next request.
  void free_reqid(std::uint32_t slot);
  // Ensures every active slot s is backed up to seq_lens[s] tokens (seq_lens has B
  // entries, 0 for inactive slots). false, with no slot's backing changed, if memory
  // is short or the backend fails; cached chunks of inactive slots unmapped to make room
  // are mapped back then (only a second backend failure during that restore leaves
  // such a slot with less cached). A backend exception propagates the same way. Raises
  // kvmm::Error, nothing changed, for a length over L or a length on an inactive slot.
  bool step(std::span<const std::uint32_t> seq_lens);

  // Chunks held by inactive slots (cached by deferred reclamation), and unmapping whole
  // inactive slots (the spare last) until at least `chunks` chunks were unmapped;
  // returns how many were (eLLM deflation hands them on). Should the backend raise on
  // an unmap, what was unmapped stays unmapped and the exception propagates.
  std::uint32_t reclaimable_chunks() const;
  std::uint32_t reclaim(std::uint32_t chunks);

  bool active(std::uint32_t slot) const;
  // Page groups per tensor currently backed in a slot (any thread may read it).
  std::uint32_t backed_groups(std::uint32_t slot) const;
  // Blocks until the mapper has drained its queue (tests, shutdown of a phase).
  void wait_idle();
  VirtualKVCacheStats stats() const;
  // Raises kvmm::Error naming the first broken invariant. Takes the state lock.
  void check_invariants() const;

 private:
  static constexpr std::uint32_t kHousekeeping = ~std::uint32_t{0};
  static constexpr std::uint32_t kNoSlot = ~std::uint32_t{0};

  TensorView view(std::uint32_t layer, std::uint32_t kv) const;
  std::uint64_t chunk_address(std::uint32_t t, std::uint32_t slot, std::uint32_t g, std::uint32_t i) const;
  std::size_t index(std::uint32_t slot, std::uint32_t g, std::uint32_t t, std::uint32_t i) const {
    return ((std::size_t{slot} * groups_per_slot_ + g) * num_tensors_ + t) * chunks_per_group_ + i;
  }
  ChunkId& table(std::uint32_t slot, std::uint32_t g, std::uint32_t t, std::uint32_t i) {
    return table_[index(slot, g, t, i)];
  }
  // All with state_mutex_ held. grow maps the listed slots' missing chunks in one
  // transaction; shrink unmaps a slot's chunks in groups [to, extent), returns how many.
  bool grow_locked(std::span<const std::uint32_t> slots, std::span<const std::uint32_t> targets);
  std::uint32_t shrink_locked(std::uint32_t slot, std::uint32_t to_groups);
  void publish(std::uint32_t slot, std::uint32_t groups);
  // Unmaps inactive slots (other than `keep`) until `chunks` are available; with
  // `only_if_enough`, does nothing unless that can succeed. Each slot it unmaps is
  // recorded in victims_ (with its backing) when `record` is set.
  bool reclaim_locked(std::uint32_t chunks, std::uint32_t keep, bool only_if_enough, bool record = false);
  // Maps the recorded victims back (after a failed step); best effort, never raises.
  void restore_victims_locked();
  // The step's synchronous part: reclaim if short, then grow, all or nothing.
  bool grow_or_restore_locked(std::uint64_t chunks);
  void enqueue(std::uint32_t item);
  void push_locked(std::uint32_t item);  // queue_mutex_ held
  void mapper_loop();
  void housekeeping();

  ChunkPool& pool_;
  VirtualKVCacheOptions options_;
  std::uint32_t num_tensors_ = 0;
  std::uint64_t token_bytes_ = 0;
  std::uint64_t slot_bytes_ = 0;
  std::uint64_t tensor_bytes_ = 0;
  std::uint32_t groups_per_slot_ = 0;
  std::uint32_t chunks_per_group_ = 0;
  VirtualRange range_;

  // State shared with the mapper: guarded by state_mutex_, except backed_ and want_,
  // which are atomics so step() can read them without the lock.
  mutable std::mutex state_mutex_;
  std::vector<std::uint8_t> active_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> backed_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> want_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> capacity_;  // tokens backed per slot
  std::vector<ChunkId> table_;
  // Per slot: groups below which the table may hold chunks (>= backed). Above backed
  // only after the backend raised on an unmap: such strays are reused by grow and
  // unmapped by shrink.
  std::vector<std::uint32_t> extent_;
  std::uint32_t spare_ = kNoSlot;
  std::vector<std::uint64_t> addrs_;  // scratch for grow_locked and shrink_locked
  std::vector<ChunkId> ids_;
  std::vector<std::size_t> where_;                              // scratch: table index of each id in shrink_locked
  std::vector<std::uint32_t> victim_slots_, victim_groups_;     // slots a failing step reclaimed
  std::vector<std::uint32_t> missing_slots_, missing_targets_;  // scratch for step

  // Mapper queue: a ring of slot ids (each at most once) plus a housekeeping flag.
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_, idle_cv_;
  std::vector<std::uint32_t> ring_;
  std::vector<std::uint8_t> queued_;
  std::size_t head_ = 0, count_ = 0;
  bool housekeeping_queued_ = false;
  bool busy_ = false;
  bool stop_ = false;
  bool sleeping_ = false;  // mapper blocked without a timeout: step() must wake it
  std::thread mapper_;

  std::atomic<std::uint64_t> steps_{0}, sync_steps_{0}, sync_groups_{0}, background_groups_{0}, reclaimed_groups_{0},
      failed_steps_{0}, background_errors_{0};
};

}  // namespace kvmm
