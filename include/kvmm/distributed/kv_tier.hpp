// KVTier: a store of KV pages shared past one engine (Redis, ...), keyed by (group, block
// hash) under a scope that makes bytes incompatible (model, dtype, layout, TP rank). Every
// call is asynchronous: contains/get/put/remove return a ticket at once, the tier's own
// threads do the I/O, and the scheduler thread collects completions with poll(), which
// never blocks (event_fd() is readable while completions wait). A get reports kOk only for
// bytes it verified and writes nothing else into the caller's pages. Submission and poll
// are O(keys) copies; the network cost is the implementation's, off the caller's thread.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/tier_key.hpp"
#include "kvmm/spec/kv_layout.hpp"
#include "kvmm/types.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm {

// TierKey and TierStatus: kvmm/caching/tier_key.hpp.

// A page and its host bytes (small_page_bytes(group) of them): the destination of a get,
// the source of a put (not modified). The bytes must stay valid until the ticket completes.
struct TierPage {
  TierKey key;
  std::byte* data = nullptr;
};

std::string_view to_string(TierStatus status);

enum class TierOp : std::uint8_t { kContains, kGet, kPut, kRemove };
std::string_view to_string(TierOp op);

using TierTicket = std::uint64_t;  // 0 is never a ticket

// One finished submission: statuses[status_begin, + num_keys) of the TierResults, in the
// order of the submitted keys.
struct TierCompletion {
  TierTicket ticket = 0;
  TierOp op = TierOp::kContains;
  std::uint32_t status_begin = 0;
  std::uint32_t num_keys = 0;
};

// What poll() appends to; reused across polls it makes no heap allocation once grown.
struct TierResults {
  std::vector<TierCompletion> completions;
  std::vector<TierStatus> statuses;
  void clear() {
    completions.clear();
    statuses.clear();
  }
  std::span<const TierStatus> status_of(const TierCompletion& c) const {
    return std::span<const TierStatus>(statuses).subspan(c.status_begin, c.num_keys);
  }
};

// Everything besides the layout that makes two engines' page bytes incompatible.
struct TierScope {
  std::string model_id;  // model name and revision
  std::string dtype;     // "bfloat16", "float16", "fp8_e4m3", ... (dtype_bytes alone cannot tell)
  std::uint32_t tp_rank = 0;
  std::uint32_t tp_size = 1;
  bool rank_shared = false;  // every rank holds the same bytes (MLA-like): rank not in the scope
};

// XXH3-64 over layout_fingerprint(layout), the model id, the dtype and (unless
// rank_shared) the TP rank and size. Raises kvmm::Error if tp_rank >= tp_size.
std::uint64_t scope_fingerprint(const KVLayout& layout, const TierScope& scope);

// The store key of a page: "<prefix>:<scope, 16 hex>:<group>:<hash hi, lo: 32 hex>".
// Writes into `out` (cleared first; reuse it to avoid allocation).
void format_tier_key(std::string_view prefix, std::uint64_t scope, const TierKey& key, std::string& out);

struct TierHealth {
  bool breaker_open = false;  // submissions complete kUnavailable without I/O
  std::uint64_t ok = 0, misses = 0, corrupt = 0, timeouts = 0, unavailable = 0;  // per key
  std::uint64_t put_existing = 0;              // puts answered "already there" (first writer won)
  std::uint64_t bytes_put = 0, bytes_got = 0;  // payload bytes
  std::uint64_t connects = 0, connect_failures = 0, io_failures = 0;
  std::uint64_t breaker_opens = 0;
};

// Thread-safe submission; poll() from one thread at a time (the scheduler's).
class KVTier {
 public:
  virtual ~KVTier() = default;
  KVTier() = default;
  KVTier(const KVTier&) = delete;
  KVTier& operator=(const KVTier&) = delete;

  virtual TierTicket contains(std::span<const TierKey> keys) = 0;  // per key kOk (present) or kMiss
  virtual TierTicket get(std::span<const TierPage> pages) = 0;     // kOk only for verified bytes
  virtual TierTicket put(std::span<const TierPage> pages) = 0;     // first writer wins
  virtual TierTicket remove(std::span<const TierKey> keys) = 0;
  // Appends every completion that has arrived; returns how many. Never blocks.
  virtual std::size_t poll(TierResults& out) = 0;
  // Readable while completions wait for poll(); for epoll/poll in the engine's loop. A
  // tier may instead signal only when armed (RedisTierOptions::notify_when_armed): then
  // poll() makes no system call, and an engine that is about to sleep calls arm() first.
  virtual int event_fd() const = 0;
  // Before sleeping on event_fd(): false when completions already wait (poll them instead);
  // else true, and the next completion makes event_fd() readable. O(1).
  virtual bool arm() = 0;
  virtual TierHealth health() const = 0;
  virtual std::uint64_t scope() const = 0;  // the scope fingerprint in every key and value
};

}  // namespace kvmm
