// Lifecycle's calls: see lifecycle.hpp.
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

void Lifecycle::commit(RequestId r, std::uint64_t n) { commit_at(r, m_.running(r), n); }
void Lifecycle::check_commit(RequestId r, std::uint64_t n) const { check_commit_at(r, m_.running(r), n); }

namespace {

void check_extras(std::span<const std::uint32_t> tokens, const RequestExtras& extras) {
  constexpr std::uint64_t kMax = KVCacheManager::kMaxTokens;
  if (tokens.size() > kMax) fail("tokens.size() = {}: a request holds at most {} tokens", tokens.size(), kMax);
  if (extras.max_tokens > kMax)
    fail("extras.max_tokens = {}: a request holds at most {} tokens", extras.max_tokens, kMax);
  if (extras.prompt_tokens > kMax)
    fail("extras.prompt_tokens = {}: a request holds at most {} tokens", extras.prompt_tokens, kMax);
  if (extras.prompt_tokens != 0 && extras.prompt_tokens < tokens.size())
    fail("extras.prompt_tokens = {}: fewer than the {} ids given", extras.prompt_tokens, tokens.size());
  const std::uint64_t prompt = std::max<std::uint64_t>(extras.prompt_tokens, tokens.size());
  const std::span<const std::uint64_t> bounds = extras.cache_boundaries;
  if (bounds.size() > kMaxCacheBoundaries)
    fail("extras.cache_boundaries.size() = {}: at most {}", bounds.size(), kMaxCacheBoundaries);
  for (std::size_t k = 0; k < bounds.size(); ++k) {
    if (bounds[k] == 0 || bounds[k] > prompt)
      fail("extras.cache_boundaries[{}] = {}: must be in [1, {}] (the prompt's tokens)", k, bounds[k], prompt);
    if (k > 0 && bounds[k] <= bounds[k - 1])
      fail("extras.cache_boundaries[{}] = {}: must be ascending (previous {})", k, bounds[k], bounds[k - 1]);
  }
  for (std::size_t k = 0; k < extras.items.size(); ++k) {
    const MultimodalItem& m = extras.items[k];
    if (m.length == 0) fail("extras.items[{}].length = 0: must be >= 1", k);
    const std::optional<std::uint64_t> end = try_add<std::uint64_t>(m.offset, m.length);
    if (!end || *end > prompt)
      fail(
          "extras.items[{}]: offset {} + length {} lies past the prompt's {} tokens (cross attention: an item's length "
          "counts encoder tokens; set extras.prompt_tokens to cover them, docs/manager.md 'Images')",
          k, m.offset, m.length, prompt);
    if (k > 0 && m.offset < extras.items[k - 1].offset + extras.items[k - 1].length)
      fail("extras.items[{}].offset = {}: items must be sorted and not overlap", k, m.offset);
  }
}

}  // namespace

RequestId Lifecycle::add_request(std::span<const std::uint32_t> tokens, const RequestExtras& extras) {
  if (m_.reqs_.full())
    fail("add_request: all max_requests = {} request rows are active (raise KVCacheManagerOptions::max_requests)",
         m_.reqs_.capacity());
  check_extras(tokens, extras);
  // The row is taken last: whatever throws before (bad_alloc reserving for max_tokens)
  // leaves the manager as it was; an inactive record's fields are rewritten on reuse.
  const Row s = m_.reqs_.next_row();
  Request& q = m_.reqs_[s];
  q.ids.assign(tokens, extras.lora_id, extras.cache_salt, extras.items, m_.class_tokens_, m_.options_.prefix_caching,
               m_.events_.runs_on() || m_.drafts.keeps_ids() || m_.partial_.on(), extras.max_tokens, m_.hasher_);
  q.drafts.clear();
  q.images.rank.clear();
  for (std::size_t k = 0; k < extras.items.size(); ++k) q.images.rank.push_back(m_.next_rank());
  q.prio = std::min<std::uint32_t>(extras.priority, SmallLru::kLevels - 1);
  q.prompt = std::max<std::uint64_t>(extras.prompt_tokens, tokens.size());
  m_.retention.set_boundaries(q, extras.cache_boundaries, std::max<std::uint64_t>(extras.prompt_tokens, tokens.size()));
  q.was_reset = false;
  clear_progress(q);  // progress, hit, tier hit, images' progress
  m_.misses.on_add(q, tokens);
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    q.images.page[g].clear();
    if (m_.groups_[g].decoder) continue;
    std::uint64_t at = 0;
    for (const MultimodalItem& m : extras.items) {
      q.images.page[g].push_back(at);
      at += m_.pages_for(m.length, m_.groups_[g].P);
    }
    q.images.page[g].push_back(at);
  }
  const RequestId r = m_.reqs_.take(Phase::kRegistered);
  m_.expensive_check();
  return r;
}

void Lifecycle::clear_progress(Request& q) {
  q.progress.reset();
  q.hit.reset();
  q.tier.reset();
  q.images.restart();
  q.miss.reported = false;
  q.drafts.reset();
}

void Lifecycle::append_tokens(RequestId r, std::span<const std::uint32_t> tokens) {
  Request& q = m_.reqs_[m_.reqs_.row(r)];
  if (tokens.size() > KVCacheManager::kMaxTokens - q.ids.num_tokens())
    fail("tokens.size() = {}: request {} has {} tokens, at most {} in all", tokens.size(), r, q.ids.num_tokens(),
         KVCacheManager::kMaxTokens);
  q.ids.append(tokens);
}

void Lifecycle::set_priority(RequestId r, std::uint32_t priority) {
  m_.reqs_[m_.reqs_.row(r)].prio = std::min<std::uint32_t>(priority, SmallLru::kLevels - 1);
}

// The first page the step wrote, if partial, must be r's own: allocate plans the copy of a
// page shared since fork; a commit without it would have let the kernels write another
// request's page.
void Lifecycle::check_shared_write(RequestId r, Row s, const Request& q, std::uint64_t c) const {
  const std::uint64_t c0 = q.progress.computed;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const Group& grp = m_.groups_[g];
    if (grp.successors > 0 && m_.drafts.shared_open_pages(s, q, g) > 0)
      fail(
          "request = {}: commit({}) writes draft pages of group {} below the computed tokens, shared since fork; call "
          "allocate(r, n) before the step's kernels so their copy-on-write copies are planned",
          r, c, g);
    if (!grp.decoder || c0 % grp.P == 0 || grp.successors > 0) continue;
    const std::span<const PageId> pages = grp.table.pages(s);
    const std::uint64_t idx = c0 / grp.P;
    if (idx < pages.size() && pages[idx] != kNullPage && grp.pg[pages[idx]].ref > 1)
      fail(
          "request = {}: commit({}) writes page {} of group {}, shared since fork; call allocate(r, n) "
          "before the step's kernels so its copy-on-write copy is planned",
          r, c, pages[idx], g);
  }
}

// Full pages below c become cached (index inserts, each missing the cache: requested ahead).
void Lifecycle::register_full_pages(Row s, Request& q, std::uint64_t c) {
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    // A successor-keyed draft page once its successor ids are known; a tagged state page
    // only by tag_state (verified_states.hpp).
    const std::uint64_t full = grp.successors > 0 ? m_.drafts.cacheable_pages(q, g, c) : c / grp.P;
    if (!grp.decoder || q.progress.registered[g] >= full) continue;
    if (grp.tagged) {
      q.progress.registered[g] = full;
      continue;
    }
    q.ids.ensure(grp.hash_class, full);
    m_.drafts.ensure_keys(q, g, full);
    const BlockHash* hv = page_keys(q, grp, g).data();
    const PageId* pages = grp.table.pages(s).data();
    std::uint64_t newly = 0;
    for (std::uint64_t i = q.progress.registered[g]; i < full; ++i) {
      prefetch_insert(m_.index_, grp, g, hv, pages, i, full);
      if (pages[i] != kNullPage && m_.store_.register_page(g, pages[i], hv[i])) {
        if (grp.successors == 0)  // successor keys are no chain a router follows
          m_.events_.stored_page(g, q.ids, hv, i, grp.P);
        if (m_.partial_.on() && i > 0) [[unlikely]]  // a hit may end inside it (hit_unit)
          m_.partial_.index_page(g, pages[i], hv[i - 1], hv[i], q.ids, i * grp.P, grp.P);
        ++newly;
      }
    }
    m_.events_.end_run();
    if (g == m_.misses.usage_group()) {
      q.miss.usage.written_tokens += newly * grp.P;
      if (q.progress.registered[g] == 0 && m_.misses.on()) [[unlikely]]
        m_.misses.on_first_page_cached(q);
    }
    if (g == m_.anchor_ && m_.branches_.enabled())
      m_.retention.learn_on_register(q, hv, q.progress.registered[g], full);
    q.progress.registered[g] = full;
  }
}

// Pages no policy needs once c tokens are computed (a sliding window's tail) are released,
// last first. Pages the step touched get this step's time; the others keep their last one.
void Lifecycle::release_out_of_window(Row s, Request& q, std::uint64_t c0, std::uint64_t c) {
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    if (!grp.decoder) continue;
    const std::span<const PageId> pages = grp.table.pages(s);
    const std::uint64_t new_lo = std::min<std::uint64_t>(grp.policy->first_needed_page(c), pages.size());
    if (new_lo <= q.progress.lo[g]) continue;
    const std::uint64_t touch_lo = grp.policy->first_touched_page(c0, c);
    // A draft group holds nothing for boundaries: a later hit never needs its pages (it
    // recomputes what is missing), so its window leaves with the step as Jenga's rule says.
    const bool holds = !q.keep.bounds.empty() && !grp.draft;
    // Prompt tails hold token windows only: a state group's checkpoint is a whole state
    // (8.7 MB a checkpoint on Jamba), a cost no tail length bounds.
    const bool tail = !grp.spec.is_state();
    // Sparse state checkpoints: the checkpoints this request computed (past its hit's),
    // but for those at its prompt's end, leave the cache as it passes them.
    const bool sparse = m_.options_.sparse_state_checkpoints && grp.spec.is_state() && !grp.tagged;
    const std::uint64_t own_lo = q.hit.tokens / grp.P;
    auto at_prompt_end = [&](std::uint64_t i) {
      return i + 1 == q.prompt / grp.P || (q.prompt > 0 && i + 1 == (q.prompt - 1) / grp.P);
    };
    for (std::uint64_t i = new_lo; i-- > q.progress.lo[g];) {
      if (i >= q.progress.lo[g] + kReleaseAhead && pages[i - kReleaseAhead] != kNullPage)
        prefetch_release(m_.store_, grp, pages[i - kReleaseAhead]);
      const PageId p = pages[i];
      if (p == kNullPage) continue;
      if (!(holds && q.keep.bounds.held(*grp.policy, i, tail) && m_.retention.hold(s, q, g, i))) {
        m_.rows_.release(g, s, i, i >= touch_lo && c > c0 ? m_.step_ : q.progress.last_step, q.prio);
        if (sparse && i >= own_lo && !at_prompt_end(i)) m_.store_.drop_cached(g, p);
      }
    }
    q.progress.lo[g] = new_lo;
  }
}

// Everything commit refuses, checked before it changes anything (also alone: check_commit).
void Lifecycle::check_commit_at(RequestId r, Row s, std::uint64_t c) const {
  const Request& q = m_.reqs_[s];
  const std::uint64_t c0 = q.progress.computed;
  if (q.loading()) [[unlikely]]
    m_.loading_error(r, "commit");
  if (c < c0) fail("num_computed_tokens = {}: request {} already has {} computed", c, r, c0);
  if (c > q.progress.allocated)
    fail("num_computed_tokens = {}: request {} has pages for {} tokens only", c, r, q.progress.allocated);
  if (q.hit.pending) fail("request = {}: commit before the allocate that pins its prefix hit", r);
  if (m_.options_.prefix_caching && c > q.ids.num_tokens())
    fail("num_computed_tokens = {}: request {} has {} token ids (append_tokens first)", c, r, q.ids.num_tokens());
  if (c > c0) check_shared_write(r, s, q, c);
}

void Lifecycle::commit_at(RequestId r, Row s, std::uint64_t num_computed_tokens) {
  Request& q = m_.reqs_[s];
  const std::uint64_t c = num_computed_tokens, c0 = q.progress.computed;
  check_commit_at(r, s, c);
  if (m_.options_.prefix_caching) register_full_pages(s, q, c);
  if (q.keep.bounds.tail_hi() > 0 && c > q.keep.bounds.tail_end()) m_.retention.drop_tail(q);
  release_out_of_window(s, q, c0, c);
  if (!q.ids.items().empty() && q.images.ready) m_.images.commit_images(s, q, c);
  q.progress.computed = c;
  if (c > c0) q.progress.last_step = m_.step_;
  m_.expensive_check();
}

RequestId Lifecycle::fork(RequestId parent) {
  const Row ps = m_.running(parent);
  if (m_.reqs_.full()) fail("fork: all max_requests = {} rows are active", m_.reqs_.capacity());
  if (m_.reqs_[ps].hit.pending) fail("request = {}: fork before the allocate that pins its prefix hit", parent);
  if (m_.reqs_[ps].loading()) m_.loading_error(parent, "fork");
  const Row s = m_.reqs_.next_row();
  const Request& pq = m_.reqs_[ps];
  Request& q = m_.reqs_[s];
  // Whole records: copied from the parent, or reset (a recycled row holds its previous
  // request's state).
  q.ids = pq.ids;
  q.prio = pq.prio;
  q.prompt = pq.prompt;
  q.was_reset = pq.was_reset;
  q.hit = pq.hit;
  q.hit.pending = false;  // checked above
  q.images = pq.images;
  q.miss.start();
  q.drafts = pq.drafts;  // successor keys cover ids the child shares
  q.keep.reset();
  q.keep.bounds = pq.keep.bounds;  // the pages the parent holds stay the parent's
  q.tier.reset();
  q.progress.reset();
  q.progress.computed = q.progress.allocated = q.progress.step_end = pq.progress.computed;
  q.progress.last_step = pq.progress.last_step;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    const std::span<const PageId> pages = grp.table.pages(ps);
    const std::size_t k =
        grp.decoder ? std::min<std::size_t>(pages.size(), m_.pages_for(pq.progress.computed, grp.P)) : pages.size();
    m_.rows_.fork_row(g, ps, s, k, grp.decoder ? pq.progress.computed : grp.table.num_tokens(ps));
    q.progress.registered[g] = std::min<std::uint64_t>(pq.progress.registered[g], k);
    q.progress.lo[g] = std::min<std::uint64_t>(pq.progress.lo[g], k);
  }
  const RequestId r = m_.reqs_.take(pq.admitted() ? Phase::kRunning : Phase::kLookedUp);
  m_.expensive_check();
  return r;
}

// Last page first: within one step the longest prefix is evicted first, so the evictor
// appends at its tail in O(1).
void Lifecycle::release_rows(Row s, Request& q) {
  m_.retention.release_held(q);
  for (GroupId g = 0; g < m_.groups_.size(); ++g) m_.rows_.release_row(g, s, q.progress.last_step, q.prio);
}

// A finished request's partial last page of each group (hit_unit): cached under its
// filled tokens' partial key and indexed by their units, so a follower (a chat's next
// turn) hits into it and copies it; evictable as any cached page. Only a page the request
// holds alone (a fork's shared page would be written in place by its other holder) after
// at least one full page (a partial key chains on its parent). O(P) per group.
void Lifecycle::cache_partial_pages(Row s, Request& q) {
  if (q.swapped() || q.loading()) return;  // no device row, or pages whose loads may not have run
  const std::uint64_t c = q.progress.computed;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const Group& grp = m_.groups_[g];
    const std::uint64_t i = c / grp.P, filled = c % grp.P;
    if (!m_.partial_.indexes(g) || filled < m_.partial_.unit() || i == 0 || q.progress.registered[g] < i) continue;
    const std::span<const PageId> pages = grp.table.pages(s);
    if (i >= pages.size() || pages[i] == kNullPage) continue;
    const PageRec& rec = m_.store_.rec(g, pages[i]);
    if (rec.ref != 1 || rec.hashed || rec.copy || q.ids.first_kept_id() > i * grp.P) continue;
    q.ids.ensure(grp.hash_class, i);
    const BlockHash parent = q.ids.chain(grp.hash_class)[i - 1];
    const BlockHash key = PartialHits::partial_key(parent, q.ids, i * grp.P, filled);
    if (m_.store_.register_page(g, pages[i], key, true))
      m_.partial_.index_page(g, pages[i], parent, key, q.ids, i * grp.P, filled);
  }
}

// Device pages, or host pages if swapped out.
void Lifecycle::release_all(Row s, Request& q) {
  if (q.swapped()) {
    m_.swap.release_host_rows(s);
  } else {
    release_rows(s, q);
  }
}

void Lifecycle::free(RequestId r) {
  const Row s = m_.reqs_.row(r);
  m_.retention.note_end(m_.reqs_[s]);
  if (m_.partial_.on()) [[unlikely]]
    cache_partial_pages(s, m_.reqs_[s]);
  release_all(s, m_.reqs_[s]);
  m_.reqs_.give_back(s);
  m_.expensive_check();
}

void Lifecycle::reset(RequestId r) {
  const Row s = m_.reqs_.row(r);
  Request& q = m_.reqs_[s];
  release_all(s, q);
  q.was_reset = true;
  clear_progress(q);
  q.to(Phase::kRegistered);
  // As a new request: its images get new random prefix lengths.
  for (std::uint64_t& rank : q.images.rank) rank = m_.next_rank();
  m_.expensive_check();
}

void Lifecycle::reset_prefix_cache() {
  // Swapped-out pages come back private: their pre-reset content is not cached again.
  m_.swap.forget_hashes();
  m_.store_.forget_all();
  m_.partial_.clear();
  m_.branches_.clear();
  m_.suffixes_.clear();
  m_.ends_.clear();
  m_.log(LogLevel::kInfo, "reset_prefix_cache: every cached hash forgotten");
  m_.expensive_check();
}

PinId Lifecycle::pin_prefix(RequestId r) {
  const Row s = m_.running(r);
  PinId id;
  if (!m_.free_pins_.empty()) {
    id = m_.free_pins_.back();
    m_.free_pins_.pop_back();
  } else {
    id = static_cast<PinId>(m_.pins_.size());
    m_.pins_.emplace_back();
  }
  auto& held = m_.pins_[id];
  held.clear();
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    for (PageId p : grp.table.pages(s)) {
      if (p == kNullPage || !grp.pg[p].hashed) continue;
      m_.rows_.hold(g, p);
      held.emplace_back(g, p);
    }
  }
  return id;
}

void Lifecycle::unpin(PinId pin) {
  if (pin >= m_.pins_.size() || std::find(m_.free_pins_.begin(), m_.free_pins_.end(), pin) != m_.free_pins_.end())
    fail("pin = {}: not an active pin", pin);
  for (auto it = m_.pins_[pin].rbegin(); it != m_.pins_[pin].rend(); ++it)
    m_.rows_.drop(it->first, it->second, m_.step_, 0);
  m_.pins_[pin].clear();
  m_.free_pins_.push_back(pin);
  m_.expensive_check();
}

}  // namespace kvmm::detail
