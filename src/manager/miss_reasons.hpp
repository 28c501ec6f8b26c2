// MissReasons (private to src/manager/; issue 34): why a lookup's hit stopped, per group,
// from the lookup's own probes, and the two small tables that tell an evicted key and a
// salt or LoRA mismatch from content never seen. Off unless
// KVCacheManagerOptions::miss_reasons: then explain() is O(groups) policy calls over the
// lookup's memoized probes (+ one table probe per group), each eviction writes one slot
// (KeyTable, page_store.hpp) and each request hashes its first page once more, without
// extra keys, at add_request.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/manager/miss_reasons.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <span>

namespace kvmm::detail {

class ManagerCore;
struct Request;

class MissReasons {
 public:
  explicit MissReasons(ManagerCore& m) : m_(m) {}
  MissReasons(const MissReasons&) = delete;
  MissReasons& operator=(const MissReasons&) = delete;

  bool on() const;
  // add_request: the key of the prompt's first page (of the first full-attention group)
  // without extra keys, when the ids given cover it.
  void on_add(Request& q, std::span<const std::uint32_t> tokens) const;
  // The anchor group's page 0 of q just became cached: its plain key now names q's keyed one.
  void on_first_page_cached(const Request& q);
  // Right after lookup_.longest_hit(q, limit) answered p: fills q's report, counts its reason.
  void explain(Request& q, std::uint64_t limit, std::uint64_t p);
  const MissCounters& counters() const { return counts_; }
  // The group whose newly cached pages count as a request's written tokens: the first
  // full-attention group, else the first decoder group (kNoGroup: none). O(groups).
  GroupId usage_group() const;

 private:
  MissReason classify(const Request& q, GroupId g, std::uint64_t k, std::uint64_t anchor_hit) const;

  ManagerCore& m_;
  MissCounters counts_;
};

}  // namespace kvmm::detail
