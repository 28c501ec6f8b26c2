// Swap's calls: see swap.hpp.
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

HostGroup::HostGroup(GroupId g, std::uint32_t n, std::uint32_t tokens_per_page, LargePagePool& pool,
                     std::uint32_t max_requests)
    : alloc(g, n, pool, max_requests),
      table(max_requests, tokens_per_page),
      hashed(std::size_t{pool.capacity()} * n, 0),
      hash(std::size_t{pool.capacity()} * n),
      len(std::size_t{pool.capacity()} * n, 0) {}

Swap::Swap(ManagerCore& m) : m_(m), pool_(m.options_.num_host_large_pages) {
  host_.reserve(m_.groups_.size());
  for (GroupId g = 0; g < m_.groups_.size(); ++g)
    host_.emplace_back(g, m_.groups_[g].n, m_.groups_[g].P, pool_, m_.options_.max_requests);
}

void Swap::release_host_rows(Row s) {
  for (HostGroup& h : host_) {
    for (PageId p : h.table.pages(s))
      if (p != kNullPage) h.alloc.free(p);
    h.alloc.release_request(s);
    h.table.clear(s);
  }
}

void Swap::forget_hashes() {
  for (HostGroup& h : host_) std::fill(h.hashed.begin(), h.hashed.end(), std::uint8_t{0});
}

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
    const std::uint64_t free_small = host_[g].alloc.num_free_small();
    if (m_.need_[g] > free_small) large_needed += (m_.need_[g] - free_small + grp.n - 1) / grp.n;
  }
  if (large_needed > pool_.num_free()) {
    m_.log(LogLevel::kInfo, "request {}: swap_out refused, {} host large pages needed, {} free", r, large_needed,
           pool_.num_free());
    return std::nullopt;
  }
  m_.plan_.clear();
  std::uint64_t reserve = large_needed;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    const std::uint64_t free_small = host_[g].alloc.num_free_small();
    if (m_.need_[g] > free_small) reserve -= (m_.need_[g] - free_small + grp.n - 1) / grp.n;
    for (PageId p : grp.table.pages(s)) {
      if (p == kNullPage) {
        host_[g].table.append(s, kNullPage);
        continue;
      }
      const std::optional<PageId> h = host_[g].alloc.allocate(s, static_cast<std::uint32_t>(reserve));
      if (!h) fail("internal: host group {} allocation failed after a capacity check", g);
      host_[g].hashed[*h] = grp.pg[p].hashed;
      host_[g].hash[*h] = grp.pg[p].hash;
      host_[g].len[*h] = grp.pg[p].node.key.prefix_len;
      host_[g].table.append(s, *h);
      m_.plan_.push_back(PageCopy{g, p, *h});
    }
    host_[g].table.set_num_tokens(s, grp.table.num_tokens(s));
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
    for (PageId h : host_[g].table.pages(s)) m_.need_[g] += h != kNullPage;
  }
  m_.admission.begin_backing(s);
  if (!m_.alloc_.feasible(s, m_.need_)) {
    m_.pool_.end_reservation();
    return std::nullopt;
  }
  m_.plan_.clear();
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    for (PageId h : host_[g].table.pages(s)) {
      if (h == kNullPage)
        m_.rows_.append_null(g, s, 1);
      else
        m_.plan_.push_back(PageCopy{g, h, m_.rows_.append_fresh(g, s, m_.step_, host_[g].len[h])});
    }
    m_.rows_.set_tokens(g, s, host_[g].table.num_tokens(s));
  }
  m_.pool_.end_reservation();
  // Re-cache after every page is placed: an eviction above may have dropped the device
  // copy of a hash that a swapped-in page now holds.
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    const std::span<const PageId> host = host_[g].table.pages(s), dev = grp.table.pages(s);
    for (std::size_t i = 0; i < host.size(); ++i) {
      const PageId h = host[i];
      if (h == kNullPage) continue;
      if (host_[g].hashed[h] && m_.store_.register_page(g, dev[i], host_[g].hash[h]) && grp.decoder)
        m_.events_.stored_page(g, q.ids, q.ids.chain(grp.hash_class).data(), i, grp.P);
      host_[g].alloc.free(h);
    }
    m_.events_.end_run();
  }
  for (HostGroup& h : host_) {
    h.alloc.release_request(s);
    h.table.clear(s);
  }
  q.to(q.swapped_from);
  q.progress.last_step = m_.step_;
  m_.counts_.swapped_in_pages += m_.plan_.size();
  m_.expensive_check();
  return std::span<const PageCopy>(m_.plan_);
}

}  // namespace kvmm::detail
