// Swap's calls: see swap.hpp.
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

std::optional<std::span<const PageCopy>> Swap::swap_out(RequestId r) {
  const Row s = m_.running(r);
  Request& q = m_.reqs_[s];
  if (q.hit.pending) fail("request = {}: swap_out before the allocate that pins its prefix hit", r);
  if (q.loading()) m_.loading_error(r, "swap_out");
  std::uint64_t large_needed = 0;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const Group& grp = m_.groups_[g];
    m_.need_[g] = 0;
    for (PageId p : grp.table.pages(s)) m_.need_[g] += p != kNullPage;
    const std::uint64_t free_small = grp.host_alloc.num_free_small();
    if (m_.need_[g] > free_small) large_needed += (m_.need_[g] - free_small + grp.n - 1) / grp.n;
  }
  if (large_needed > m_.host_pool_.num_free()) {
    m_.log(LogLevel::kInfo, "request {}: swap_out refused, {} host large pages needed, {} free", r, large_needed,
           m_.host_pool_.num_free());
    return std::nullopt;
  }
  m_.plan_.clear();
  std::uint64_t reserve = large_needed;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    const std::uint64_t free_small = grp.host_alloc.num_free_small();
    if (m_.need_[g] > free_small) reserve -= (m_.need_[g] - free_small + grp.n - 1) / grp.n;
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
      m_.plan_.push_back(PageCopy{g, p, *h});
    }
    grp.host_table.set_num_tokens(s, grp.table.num_tokens(s));
  }
  m_.lifecycle.release_rows(s, q);
  q.swapped_from = q.phase;
  q.to(Phase::kSwapped);
  m_.counts_.swapped_out_pages += m_.plan_.size();
  m_.expensive_check();
  return std::span<const PageCopy>(m_.plan_);
}

std::optional<std::span<const PageCopy>> Swap::swap_in(RequestId r) {
  const Row s = m_.reqs_.row(r);
  Request& q = m_.reqs_[s];
  if (!q.swapped()) fail("request = {}: not swapped out", r);
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    m_.need_[g] = 0;
    for (PageId h : m_.groups_[g].host_table.pages(s)) m_.need_[g] += h != kNullPage;
  }
  m_.admission.begin_backing(s);
  if (!m_.alloc_.feasible(s, m_.need_)) {
    m_.pool_.end_reservation();
    return std::nullopt;
  }
  m_.plan_.clear();
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    for (PageId h : grp.host_table.pages(s)) {
      if (h == kNullPage)
        m_.rows_.append_null(g, s, 1);
      else
        m_.plan_.push_back(PageCopy{g, h, m_.rows_.append_fresh(g, s, m_.step_, grp.host_len[h])});
    }
    m_.rows_.set_tokens(g, s, grp.host_table.num_tokens(s));
  }
  m_.pool_.end_reservation();
  // Re-cache after every page is placed: an eviction above may have dropped the device
  // copy of a hash that a swapped-in page now holds.
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    const std::span<const PageId> host = grp.host_table.pages(s), dev = grp.table.pages(s);
    for (std::size_t i = 0; i < host.size(); ++i) {
      const PageId h = host[i];
      if (h == kNullPage) continue;
      if (grp.host_hashed[h] && m_.store_.register_page(g, dev[i], grp.host_hash[h]) && grp.decoder)
        m_.events_.stored_page(g, q.ids, q.ids.chain(grp.hash_class).data(), i, grp.P);
      grp.host_alloc.free(h);
    }
    m_.events_.end_run();
  }
  for (Group& grp : m_.groups_) {
    grp.host_alloc.release_request(s);
    grp.host_table.clear(s);
  }
  q.to(q.swapped_from);
  q.progress.last_step = m_.step_;
  m_.counts_.swapped_in_pages += m_.plan_.size();
  m_.expensive_check();
  return std::span<const PageCopy>(m_.plan_);
}

}  // namespace kvmm::detail
