// Rows' calls that are more than a table write and one reference change: see rows.hpp.
#include "rows.hpp"

#include "kvmm/error.hpp"

namespace kvmm::detail {

PageId Rows::take_fresh(GroupId g, Row s, std::uint64_t step, std::uint64_t prefix_len) {
  const PageId p = alloc_.take_page(g, s);
  if (p == kNullPage) fail("internal: group {} allocation failed after a successful feasibility check", g);
  store_.init_page(g, p, step, prefix_len);
  return p;
}

PageCopy Rows::copy_on_write(GroupId g, Row s, std::uint64_t idx, std::uint64_t step, std::uint64_t last_step,
                             std::uint32_t prio) {
  Group& grp = groups_[g];
  const PageId old = grp.table.pages(s)[idx];
  const PageId p = take_fresh(g, s, step, grp.pg[old].node.key.prefix_len);
  grp.table.set(s, static_cast<std::uint32_t>(idx), p);
  store_.release(g, old, last_step, prio);
  return PageCopy{g, old, p};
}

bool Rows::adopt_run(GroupId g, Row s, std::uint64_t lo, std::uint64_t pages, const PageId* hit,
                     const BlockHash* check) {
  const std::size_t pinned = store_.acquire_run(g, hit + lo, check == nullptr ? nullptr : check + lo, pages - lo);
  if (pinned != pages - lo) {  // a page was evicted since the lookup: undo this group's
    for (std::size_t i = pinned; i-- > 0;) store_.release(g, hit[lo + i], 0, store_.rec(g, hit[lo + i]).prio);
    return false;
  }
  PageTableSet& table = groups_[g].table;
  table.append(s, lo, kNullPage);
  table.append(s, std::span<const PageId>(hit + lo, hit + pages));
  return true;
}

void Rows::truncate(GroupId g, Row s, std::uint64_t pages, std::uint64_t tokens, std::uint64_t t, std::uint32_t prio) {
  PageTableSet& table = groups_[g].table;
  while (table.num_pages(s) > pages)
    if (const PageId p = table.pop_back(s); p != kNullPage) store_.release(g, p, t, prio);
  table.set_num_tokens(s, tokens);
}

void Rows::release_row(GroupId g, Row s, std::uint64_t t, std::uint32_t prio) {
  Group& grp = groups_[g];
  store_.release_row(g, grp.table.pages(s), t, prio);
  grp.alloc.release_request(s);
  grp.table.clear(s);
}

void Rows::unadopt_row(GroupId g, Row s, bool end_association) {
  Group& grp = groups_[g];
  const std::span<const PageId> row = grp.table.pages(s);
  for (std::size_t i = row.size(); i-- > 0;)
    if (row[i] != kNullPage) store_.release(g, row[i], 0, store_.rec(g, row[i]).prio);
  if (end_association) grp.alloc.release_request(s);
  grp.table.clear(s);
}

void Rows::fork_row(GroupId g, Row parent, Row child, std::size_t k, std::uint64_t tokens) {
  Group& grp = groups_[g];
  const std::span<const PageId> pages = grp.table.pages(parent);
  for (std::size_t i = 0; i < k; ++i) {
    grp.table.append(child, pages[i]);
    if (pages[i] != kNullPage) store_.share(g, pages[i]);
  }
  grp.table.set_num_tokens(child, tokens);
}

}  // namespace kvmm::detail
