// DraftGroups' calls: see draft_groups.hpp.
#include "draft_groups.hpp"

#include "kvmm/error.hpp"
#include "manager_core.hpp"

#include <algorithm>

namespace kvmm::detail {

DraftGroups::DraftGroups(ManagerCore& m) : m_(m) {
  for (const Group& grp : m_.groups_) keyed_ |= grp.successors > 0;
}

void DraftGroups::ensure_keys(Request& q, GroupId g, std::uint64_t pages) {
  const Group& grp = m_.groups_[g];
  if (grp.successors == 0) return;
  std::vector<BlockHash>& keys = q.drafts.keys[g];
  const std::uint64_t n = q.ids.num_tokens();
  const std::uint64_t known = n >= grp.successors ? (n - grp.successors) / grp.P : 0;
  const std::uint64_t want = std::min(pages, known);
  if (keys.size() >= want) return;
  q.ids.ensure(grp.hash_class, want);
  const std::span<const BlockHash> chain = q.ids.chain(grp.hash_class);
  const bool salted = !q.ids.salt().empty();
  for (std::uint64_t i = keys.size(); i < want; ++i)
    keys.push_back(
        q.ids.hasher().hash_page(salted, chain[i], q.ids.ids((i + 1) * grp.P, grp.successors), PageExtraKeys{}));
}

std::uint64_t DraftGroups::cacheable_pages(const Request& q, GroupId g, std::uint64_t c) const {
  const Group& grp = m_.groups_[g];
  const std::uint64_t n = q.ids.num_tokens();
  const std::uint64_t known = n >= grp.successors ? n - grp.successors : 0;
  return std::min(c, known) / grp.P;
}

namespace {

// Row s's open pages of group g: [registered, pages holding a computed token).
std::pair<std::uint64_t, std::uint64_t> open_pages(const Group& grp, Row s, const Request& q, GroupId g) {
  const std::uint64_t hi = std::min<std::uint64_t>(grp.table.num_pages(s), (q.progress.computed + grp.P - 1) / grp.P);
  return {std::min(q.progress.registered[g], hi), hi};
}

}  // namespace

std::uint32_t DraftGroups::shared_open_pages(Row s, const Request& q, GroupId g) const {
  const Group& grp = m_.groups_[g];
  const auto [lo, hi] = open_pages(grp, s, q, g);
  const std::span<const PageId> pages = grp.table.pages(s);
  std::uint32_t n = 0;
  for (std::uint64_t i = lo; i < hi; ++i) n += pages[i] != kNullPage && grp.pg[pages[i]].ref > 1;
  return n;
}

void DraftGroups::copy_open_pages(Row s, Request& q, GroupId g) {
  Group& grp = m_.groups_[g];
  const auto [lo, hi] = open_pages(grp, s, q, g);
  for (std::uint64_t i = lo; i < hi; ++i) {
    const PageId p = grp.table.pages(s)[i];
    if (p == kNullPage || grp.pg[p].ref <= 1) continue;
    m_.copies_.push_back(m_.rows_.copy_on_write(g, s, i, m_.step_, q.progress.last_step, q.prio));
    ++m_.counts_.cow_copies;
  }
}

TokenRange DraftGroups::recompute(RequestId r, GroupId g) const {
  const Request& q = m_.req(r);
  const Group& grp = m_.group(g);
  if (!grp.draft) fail("group = {}: '{}' is not a draft group (LayerGroup::draft)", g, grp.spec.name);
  if (!q.looked_up() || q.hit.tokens == 0) return {};
  return {std::min(q.drafts.hit[g], q.hit.tokens), q.hit.tokens};
}

}  // namespace kvmm::detail
