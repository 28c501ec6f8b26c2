// BoundaryRetention's calls: see boundary_retention.hpp.
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

// The options and layout are the core's first members: set before this unit.
BoundaryRetention::BoundaryRetention(ManagerCore& m)
    : m_(m),
      budget_(static_cast<std::uint64_t>(m.options_.retention_budget * static_cast<double>(m.options_.num_large_pages) *
                                         static_cast<double>(m.layout_.large_page_bytes()))) {}

void BoundaryRetention::update_anchor() {
  m_.anchor_ = kNoGroup;
  for (GroupId g = 0; g < m_.groups_.size() && m_.anchor_ == kNoGroup; ++g)
    if (m_.groups_[g].decoder && m_.groups_[g].whole_prefix && !m_.groups_[g].draft) m_.anchor_ = g;
}

// Hinted boundaries replace the row's; the held list is reserved for them (a sliding
// window's w / P + 1 pages per boundary), so holding them never touches the heap mid-step.
void BoundaryRetention::set_boundaries(Request& q, std::span<const std::uint64_t> hinted, std::uint64_t prompt) {
  q.keep.bounds.clear();
  q.keep.held.clear();
  std::fill(q.keep.held_in.begin(), q.keep.held_in.end(), 0);
  for (std::uint64_t L : hinted) q.keep.bounds.add(L);
  const std::uint64_t tail = m_.options_.prefix_caching ? m_.options_.prompt_tail_tokens : 0;
  if (tail > 0 && prompt > 0) {
    // Back as far as followers were seen to part from a shared prefix (the learned 95th
    // percentile of their suffixes), at least prompt_tail_tokens.
    const std::uint64_t back = std::max(tail, m_.suffixes_.range().second);
    q.keep.bounds.set_tail(prompt > back ? prompt - back : 1, prompt, prompt + tail);
  }
  // Room for every page the boundaries may hold (a bound, not the count): no heap use
  // when pages leave the windows.
  std::uint64_t most = 0;
  auto room = [&](const Group& grp, std::uint64_t lo, std::uint64_t hi) {
    const std::uint64_t pages = hi / grp.P;
    most += pages - std::min(pages, grp.policy->first_required_page(lo / grp.P * grp.P));
  };
  for (const Group& grp : m_.groups_) {
    if (!grp.decoder) continue;
    for (std::uint64_t L : hinted) room(grp, L, L);
    if (q.keep.bounds.tail_hi() > 0 && !grp.spec.is_state())
      room(grp, q.keep.bounds.tail_lo(), q.keep.bounds.tail_hi());
  }
  q.keep.held.reserve(most);
}

// At its first admission: a whole-prefix hit longer than the hit every group allowed is a
// branch point (learned, and held by this request, which recomputes up to it); a hit that
// ends at a learned point is held again, so the prefix stays findable after this request.
void BoundaryRetention::learn_at_admission(Request& q) {
  if (m_.anchor_ == kNoGroup) return;
  const Group& a = m_.groups_[m_.anchor_];
  // A preempted request's own pages are not another request's prefix: where they part from
  // the hit says nothing about what others share.
  if (q.was_reset) return;
  // A full-attention hit that ended inside the prompt, a page or more before its limit: the
  // request parts there from an earlier one, its suffix that long.
  // One that parts where an earlier request's cached pages end continues it (a chat turn,
  // a tool call's next step): it parts at no point inside another's prompt.
  if (const std::uint64_t w = q.hit.branch / a.P * a.P; m_.suffixes_.enabled() && w > 0 && w + a.P <= q.hit.limit) {
    const std::span<const BlockHash> ch = q.ids.chain(a.hash_class);
    // One whose next page was evicted lost the rest of a shared prefix: no branch either.
    if (w / a.P < ch.size() && !m_.ends_.contains(ch[w / a.P - 1]) && !m_.store_.was_evicted(m_.anchor_, ch[w / a.P]))
      m_.suffixes_.add(q.hit.lookup_tokens - w);
  }
  if (!m_.branches_.enabled()) return;
  const std::span<const BlockHash> chain = q.ids.chain(a.hash_class);
  if (const std::uint64_t pages = q.hit.branch / a.P;
      q.hit.branch > q.hit.tokens && pages > 0 && pages <= chain.size()) {
    m_.branches_.insert(chain[pages - 1]);
    q.keep.bounds.add(pages * a.P);
  }
  if (const std::uint64_t pages = q.hit.tokens / a.P;
      pages > 0 && pages <= chain.size() && m_.branches_.contains(chain[pages - 1]))
    q.keep.bounds.add(pages * a.P);
}

// The anchor group's pages [from, full) just registered: a learned point among them is a
// boundary of this request.
void BoundaryRetention::learn_on_register(Request& q, const BlockHash* hv, std::uint64_t from, std::uint64_t full) {
  for (std::uint64_t i = from; i < full; ++i)
    if (m_.branches_.contains(hv[i])) q.keep.bounds.add((i + 1) * m_.groups_[m_.anchor_].P);
}

// Held pages go back with the request's last access time, the key its full-attention pages
// at the same positions get in release_rows: the cached prefix ages as one unit.
// A prompt tail is a guess: it is kept only while it stays cheap. Once the request has
// computed prompt_tail_tokens past its prompt (a long answer: the window a hit at the
// prompt's end needs would keep growing out of the table), the tail stops being a
// boundary and the pages only it held are released, last held first, keyed with this
// step: they were in use until now, so they age from now (released with their older
// times they would be the next victims, and a question arriving after a long answer
// would miss). O(held pages), once per request.
void BoundaryRetention::drop_tail(Request& q) {
  q.keep.bounds.set_tail(0, 0, 0);
  auto tail_only = [&](const HeldPage& h) { return !q.keep.bounds.held(*m_.groups_[h.group].policy, h.index, false); };
  for (std::size_t k = q.keep.held.size(); k-- > 0;) {
    if (!tail_only(q.keep.held[k])) continue;
    m_.rows_.drop(q.keep.held[k].group, q.keep.held[k].page, m_.step_, q.prio);
    --q.keep.held_in[q.keep.held[k].group];
    forget(q.keep.held[k]);
  }
  std::erase_if(q.keep.held, tail_only);
}

void BoundaryRetention::note_end(const Request& q) {
  if (!m_.ends_.enabled() || m_.anchor_ == kNoGroup) return;
  const std::span<const BlockHash> chain = q.ids.chain(m_.groups_[m_.anchor_].hash_class);
  if (const std::uint64_t pages = q.progress.registered[m_.anchor_]; pages > 0 && pages <= chain.size())
    m_.ends_.insert(chain[pages - 1]);
}

void BoundaryRetention::release_held(Request& q) {
  for (auto it = q.keep.held.rbegin(); it != q.keep.held.rend(); ++it) {
    m_.rows_.drop(it->group, it->page, q.progress.last_step, q.prio);
    forget(*it);
  }
  q.keep.held.clear();
  std::fill(q.keep.held_in.begin(), q.keep.held_in.end(), 0);
}

void BoundaryRetention::forget(const HeldPage& h) { held_bytes_ -= m_.layout_.small_page_bytes(h.group); }

bool BoundaryRetention::hold(Row s, Request& q, GroupId g, std::uint64_t i) {
  const std::uint64_t bytes = m_.layout_.small_page_bytes(g);
  if (bytes > budget_ - held_bytes_) return false;                            // held_bytes_ <= budget_ always
  q.keep.held.push_back(HeldPage{g, m_.rows_.detach(g, s, i), i, m_.step_});  // keeps its reference until free
  ++q.keep.held_in[g];
  held_bytes_ += bytes;
  return true;
}

// Oldest hold first, until `want` bytes went back: kOwn takes row self's list from its front
// (held in step order), kAll sorts every request's holds by step. Released at time 0 (the
// key is the page's own last use: release keeps the later of the two) and level 0, so the
// retried allocate evicts them before any other cached page; still cached until then.
std::uint64_t BoundaryRetention::release_under_pressure(Row self, std::uint64_t want) {
  const RetentionRelease mode = m_.options_.retention_release;
  if (held_bytes_ == 0 || mode == RetentionRelease::kOff) return 0;
  cand_.clear();
  const bool own = mode == RetentionRelease::kOwn;
  for (Row s{own ? self.index : 0}; s.index < (own ? self.index + 1 : m_.reqs_.capacity()); ++s.index) {
    const Request& q = m_.reqs_[s];
    if (!q.active()) continue;
    for (std::uint32_t k = 0; k < q.keep.held.size(); ++k) cand_.push_back({q.keep.held[k].step, s.index, k});
  }
  if (mode == RetentionRelease::kAll)
    std::stable_sort(cand_.begin(), cand_.end(),
                     [](const Candidate& a, const Candidate& b) { return a.step < b.step; });
  std::uint64_t done = 0;
  std::size_t n = 0;
  for (; n < cand_.size() && done < want; ++n) {
    Request& q = m_.reqs_[Row{cand_[n].row}];
    HeldPage& h = q.keep.held[cand_[n].k];
    m_.rows_.drop(h.group, h.page, 0, 0);
    done += m_.layout_.small_page_bytes(h.group);
    forget(h);
    --q.keep.held_in[h.group];
    h.page = kNullPage;  // erased below, once per row
    ++released_;
  }
  cand_.resize(n);  // the released ones: erase them from each row's list once
  std::sort(cand_.begin(), cand_.end(), [](const Candidate& a, const Candidate& b) { return a.row < b.row; });
  for (std::size_t k = 0; k < n; ++k)
    if (k == 0 || cand_[k].row != cand_[k - 1].row)
      std::erase_if(m_.reqs_[Row{cand_[k].row}].keep.held, [](const HeldPage& h) { return h.page == kNullPage; });
  if (done > 0) m_.log(LogLevel::kDebug, "memory short: {} bytes held for retention released", done);
  return done;
}

}  // namespace kvmm::detail
