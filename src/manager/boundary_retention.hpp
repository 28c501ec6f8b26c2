// BoundaryRetention (private to src/manager/): where a request's pages are held past its
// window for later hits. Hinted boundaries and the prompt tail at add_request (O(groups x
// boundaries)), branch points learned at admission and commit (O(1) per page), a tail
// dropped once a long answer makes it costly, held pages released at the end (O(held)).
// The rules and their costs: retention.hpp.
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
  explicit BoundaryRetention(ManagerCore& m) : m_(m) {}
  BoundaryRetention(const BoundaryRetention&) = delete;
  BoundaryRetention& operator=(const BoundaryRetention&) = delete;

  void update_anchor();
  void set_boundaries(Request& q, std::span<const std::uint64_t> hinted, std::uint64_t prompt);
  void learn_at_admission(Request& q);
  void learn_on_register(Request& q, const BlockHash* hv, std::uint64_t from, std::uint64_t full);
  void drop_tail(Request& q);
  void release_held(Request& q);
  // At free: where q's cached pages end (the adaptive tail tells a continuation from a
  // branch by it). O(1).
  void note_end(const Request& q);

 private:
  ManagerCore& m_;
};

}  // namespace kvmm::detail
