// Swap (private to src/manager/): PagedAttention §4.5's swapping. swap_out moves every page
// of a request to the host pool, all or nothing (an exact capacity check: the host pool
// caches nothing); swap_in takes device pages back through Jenga's steps, all or nothing
// (the feasibility replay). Each O(pages of the request); the copies are the engine's.
// The host pool and the host rows are this unit's: nothing else writes them. Costs
// host_large_pages x (small pages per large page) x 42 bytes of records per group.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/paging/large_page_pool.hpp"
#include "kvmm/paging/page_table.hpp"
#include "kvmm/paging/small_page_allocator.hpp"
#include "kvmm/types.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class ManagerCore;

// One group's host pages: allocator, rows, and what each page held on the device.
struct HostGroup {
  HostGroup(GroupId g, std::uint32_t n, std::uint32_t tokens_per_page, LargePagePool& pool, std::uint32_t max_requests);
  SmallPageAllocator alloc;
  PageTableSet table;
  std::vector<std::uint8_t> hashed;
  std::vector<BlockHash> hash;
  std::vector<std::uint64_t> len;
};

class Swap {
 public:
  explicit Swap(ManagerCore& m);
  Swap(const Swap&) = delete;
  Swap& operator=(const Swap&) = delete;

  std::optional<std::span<const PageCopy>> swap_out(RequestId r);
  std::optional<std::span<const PageCopy>> swap_in(RequestId r);
  // A swapped-out request's host rows released (free and reset of a swapped request).
  void release_host_rows(Row s);
  // Swapped-out pages come back private: their pre-reset content is not cached again.
  void forget_hashes();
  const HostGroup& host(GroupId g) const { return host_[g]; }

 private:
  ManagerCore& m_;
  LargePagePool pool_;
  std::vector<HostGroup> host_;  // never reallocated: each allocator points at pool_
};

}  // namespace kvmm::detail
