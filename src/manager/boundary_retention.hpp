// BoundaryRetention (private to src/manager/): where a request's pages are held past its
// window for later hits. Hinted boundaries and the prompt tail at add_request (O(groups x
// boundaries)), branch points learned at admission and commit (O(1) per page), a tail
// dropped once a long answer makes it costly, held pages released at the end (O(held)).
// What is held is bounded (KVCacheManagerOptions::retention_budget: a page that would pass
// it is not held, O(1)) and released under pressure (KVCacheManagerOptions::
// retention_release: a running request's allocate that memory cannot serve otherwise
// first releases, by default, its own held pages, oldest first, as many as it needs;
// O(held pages)). The rules and their costs: retention.hpp.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class ManagerCore;

class BoundaryRetention {
 public:
  explicit BoundaryRetention(ManagerCore& m);
  BoundaryRetention(const BoundaryRetention&) = delete;
  BoundaryRetention& operator=(const BoundaryRetention&) = delete;

  void update_anchor();
  void set_boundaries(Request& q, std::span<const std::uint64_t> hinted, std::uint64_t prompt);
  void learn_at_admission(Request& q);
  void learn_on_register(Request& q, const BlockHash* hv, std::uint64_t from, std::uint64_t full);
  void drop_tail(Request& q);
  void release_held(Request& q);
  // Page i of row s (request q) in group g left the window and a boundary needs it: held
  // if the bound has room for it (true), else left to the caller to release. O(1).
  bool hold(Row s, Request& q, GroupId g, std::uint64_t i);
  // Pressure (KVCacheManagerOptions::retention_release): held pages go back to the evictor,
  // oldest hold first, until `want` bytes did (kOwn: those row self holds; kAll: any
  // request's; kOff: none); still cached (lowest retention level, keyed by their last use),
  // the requests keep their boundaries. Returns the bytes released. O(rows + held pages),
  // kAll O(H log H) over the H held pages.
  std::uint64_t release_under_pressure(Row self, std::uint64_t want);
  std::uint64_t held_bytes() const { return held_bytes_; }
  std::uint64_t budget_bytes() const { return budget_; }
  std::uint64_t released_pages() const { return released_; }
  // At free: where q's cached pages end (the adaptive tail tells a continuation from a
  // branch by it). O(1).
  void note_end(const Request& q);

 private:
  void forget(const HeldPage& h);  // h no longer held: its bytes leave the count

  ManagerCore& m_;
  std::uint64_t budget_ = 0;      // options_.retention_budget of the pool's bytes
  std::uint64_t held_bytes_ = 0;  // small-page bytes of every held page
  std::uint64_t released_ = 0;    // held pages released under pressure
  struct Candidate {
    std::uint64_t step;    // when held
    std::uint32_t row, k;  // q.keep.held[k] of row
  };
  std::vector<Candidate> cand_;  // scratch of release_under_pressure
};

}  // namespace kvmm::detail
