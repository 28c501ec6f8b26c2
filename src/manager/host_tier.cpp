// ManagerCore's swapping (PagedAttention §4.5): swap_out moves every page of a request to
// the host pool, all or nothing (an exact capacity check: the host pool caches nothing);
// swap_in takes device pages back through Jenga's steps, all or nothing (the feasibility
// replay). Each O(pages of the request); the copies are the engine's to run.
#include "manager_core.hpp"

#include "kvmm/error.hpp"

namespace kvmm::detail {

std::optional<std::span<const PageCopy>> ManagerCore::swap_out(RequestId r) {
  const std::uint32_t s = running(r);
  Request& q = reqs_[s];
  if (q.hit_pending) fail("request = {}: swap_out before the allocate that pins its prefix hit", r);
  if (q.loading) loading_error(r, "swap_out");
  std::uint64_t large_needed = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    need_[g] = 0;
    for (PageId p : grp.table.pages(s)) need_[g] += p != kNullPage;
    const std::uint64_t free_small = grp.host_alloc.num_free_small();
    if (need_[g] > free_small) large_needed += (need_[g] - free_small + grp.n - 1) / grp.n;
  }
  if (large_needed > host_pool_.num_free()) {
    log(LogLevel::kInfo, "request {}: swap_out refused, {} host large pages needed, {} free", r, large_needed,
        host_pool_.num_free());
    return std::nullopt;
  }
  plan_.clear();
  std::uint64_t reserve = large_needed;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    const std::uint64_t free_small = grp.host_alloc.num_free_small();
    if (need_[g] > free_small) reserve -= (need_[g] - free_small + grp.n - 1) / grp.n;
    for (PageId p : grp.table.pages(s)) {
      if (p == kNullPage) {
        grp.host_table.append(s, kNullPage);
        continue;
      }
      const std::optional<PageId> h = grp.host_alloc.allocate(s, static_cast<std::uint32_t>(reserve));
      if (!h) fail("internal: host group {} allocation failed after a capacity check", g);
      grp.host_hashed[*h] = grp.pg[p].hashed;
      grp.host_hash[*h] = grp.pg[p].hash;
      grp.host_len[*h] = grp.pg[p].node.key.prefix_len;
      grp.host_table.append(s, *h);
      plan_.push_back(PageCopy{g, p, *h});
    }
    grp.host_table.set_num_tokens(s, grp.table.num_tokens(s));
  }
  release_rows(s, q);
  q.swapped = true;
  counts_.swapped_out_pages += plan_.size();
  expensive_check();
  return std::span<const PageCopy>(plan_);
}

std::optional<std::span<const PageCopy>> ManagerCore::swap_in(RequestId r) {
  const std::uint32_t s = reqs_.row(r);
  Request& q = reqs_[s];
  if (!q.swapped) fail("request = {}: not swapped out", r);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    need_[g] = 0;
    for (PageId h : groups_[g].host_table.pages(s)) need_[g] += h != kNullPage;
  }
  begin_backing(s);
  if (!alloc_.feasible(s, need_)) {
    pool_.end_reservation();
    return std::nullopt;
  }
  plan_.clear();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    for (PageId h : grp.host_table.pages(s)) {
      if (h == kNullPage) {
        grp.table.append(s, kNullPage);
        continue;
      }
      const PageId p = alloc_.take_page(g, s);
      if (p == kNullPage) fail("internal: group {} allocation failed after a successful feasibility check", g);
      store_.init_page(g, p, step_, grp.host_len[h]);
      grp.table.append(s, p);
      plan_.push_back(PageCopy{g, h, p});
    }
    grp.table.set_num_tokens(s, grp.host_table.num_tokens(s));
  }
  pool_.end_reservation();
  // Re-cache after every page is placed: an eviction above may have dropped the device
  // copy of a hash that a swapped-in page now holds.
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    const std::span<const PageId> host = grp.host_table.pages(s), dev = grp.table.pages(s);
    for (std::size_t i = 0; i < host.size(); ++i) {
      const PageId h = host[i];
      if (h == kNullPage) continue;
      if (grp.host_hashed[h] && store_.register_page(g, dev[i], grp.host_hash[h]) && grp.decoder)
        events_.stored_page(g, q.ids, q.ids.chain(grp.hash_class).data(), i, grp.P);
      grp.host_alloc.free(h);
    }
    events_.end_run();
  }
  for (Group& grp : groups_) {
    grp.host_alloc.release_request(s);
    grp.host_table.clear(s);
  }
  q.swapped = false;
  q.last_step = step_;
  counts_.swapped_in_pages += plan_.size();
  expensive_check();
  return std::span<const PageCopy>(plan_);
}

}  // namespace kvmm::detail
