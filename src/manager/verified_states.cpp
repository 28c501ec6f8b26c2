// VerifiedStates' calls: see verified_states.hpp.
#include "verified_states.hpp"

#include "kvmm/error.hpp"
#include "manager_core.hpp"

namespace kvmm::detail {

bool VerifiedStates::tag(RequestId r, GroupId g, std::uint64_t state_tokens) {
  const Row s = m_.running(r);
  Request& q = m_.reqs_[s];
  Group& grp = m_.groups_[m_.check_group(g)];
  if (!grp.tagged)
    fail("group = {}: '{}' has no tagged checkpoints (LayerGroup::tagged_checkpoints)", g, grp.spec.name);
  if (q.loading()) [[unlikely]]
    m_.loading_error(r, "tag_state");
  if (state_tokens == 0) fail("state_tokens = 0: a checkpoint holds at least one token");
  if (state_tokens > q.progress.allocated)
    fail("state_tokens = {}: request {} has pages for {} tokens only", state_tokens, r, q.progress.allocated);
  // Refused: a state over a position not verified (committed) yet, i.e. one holding drafts.
  if (state_tokens > q.progress.computed) return false;
  if (state_tokens % grp.P != 0 || !m_.options_.prefix_caching) return false;  // not a checkpoint
  const std::uint64_t i = state_tokens / grp.P - 1;
  const std::span<const PageId> pages = grp.table.pages(s);
  if (i >= pages.size() || pages[i] == kNullPage) return false;  // no longer r's
  q.ids.ensure(grp.hash_class, i + 1);
  const BlockHash* hv = q.ids.chain(grp.hash_class).data();
  if (m_.store_.register_page(g, pages[i], hv[i])) {
    m_.events_.stored_page(g, q.ids, hv, i, grp.P);
    m_.events_.end_run();
  }
  m_.expensive_check();
  const PageRec& rec = m_.store_.rec(g, pages[i]);
  return rec.hashed != 0 || rec.copy != 0;
}

}  // namespace kvmm::detail
