// Swap (private to src/manager/): PagedAttention §4.5's swapping. swap_out moves every page
// of a request to the host pool, all or nothing (an exact capacity check: the host pool
// caches nothing); swap_in takes device pages back through Jenga's steps, all or nothing
// (the feasibility replay). Each O(pages of the request); the copies are the engine's.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class ManagerCore;

class Swap {
 public:
  explicit Swap(ManagerCore& m) : m_(m) {}
  Swap(const Swap&) = delete;
  Swap& operator=(const Swap&) = delete;

  std::optional<std::span<const PageCopy>> swap_out(RequestId r);
  std::optional<std::span<const PageCopy>> swap_in(RequestId r);

 private:
  ManagerCore& m_;
};

}  // namespace kvmm::detail
