// ManagerCore's calls after admission: commit (caches full pages, O(new pages); releases
// pages out of every policy's need, O(released)), fork (O(pages)), free and reset
// (O(pages held)), prefix pins, and reset_prefix_cache (O(pages)).
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

// ---------------------------------------------------------------- commit

// The first page the step wrote, if partial, must be r's own: allocate plans the copy of a
// page shared since fork; a commit without it would have let the kernels write another
// request's page.
void ManagerCore::check_shared_write(RequestId r, std::uint32_t s, const Request& q, std::uint64_t c) const {
  const std::uint64_t c0 = q.computed;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    if (!grp.decoder || c0 % grp.P == 0) continue;
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
void ManagerCore::register_full_pages(std::uint32_t s, Request& q, std::uint64_t c) {
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    const std::uint64_t full = c / grp.P;
    if (!grp.decoder || q.registered[g] >= full) continue;
    q.ids.ensure(grp.hash_class, full);
    const BlockHash* hv = q.ids.chain(grp.hash_class).data();
    const PageId* pages = grp.table.pages(s).data();
    for (std::uint64_t i = q.registered[g]; i < full; ++i) {
      prefetch_insert(index_, grp, g, hv, pages, i, full);
      if (pages[i] != kNullPage && store_.register_page(g, pages[i], hv[i]))
        events_.stored_page(g, q.ids, hv, i, grp.P);
    }
    events_.end_run();
    if (g == anchor_ && branches_.enabled()) learn_on_register(q, hv, q.registered[g], full);
    q.registered[g] = full;
  }
}

// Pages no policy needs once c tokens are computed (a sliding window's tail) are released,
// last first. Pages the step touched get this step's time; the others keep their last one.
void ManagerCore::release_out_of_window(std::uint32_t s, Request& q, std::uint64_t c0, std::uint64_t c) {
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (!grp.decoder) continue;
    const std::span<const PageId> pages = grp.table.pages(s);
    const std::uint64_t new_lo = std::min<std::uint64_t>(grp.policy->first_needed_page(c), pages.size());
    if (new_lo <= q.lo[g]) continue;
    const std::uint64_t touch_lo = grp.policy->first_touched_page(c0, c);
    const bool holds = !q.bounds.empty();
    // Prompt tails hold token windows only: a state group's checkpoint is a whole state
    // (8.7 MB a checkpoint on Jamba), a cost no tail length bounds.
    const bool tail = !grp.spec.is_state();
    for (std::uint64_t i = new_lo; i-- > q.lo[g];) {
      if (i >= q.lo[g] + kReleaseAhead && pages[i - kReleaseAhead] != kNullPage)
        prefetch_release(store_, grp, pages[i - kReleaseAhead]);
      const PageId p = pages[i];
      if (p == kNullPage) continue;
      if (holds && q.bounds.held(*grp.policy, i, tail)) {
        q.held.push_back(HeldPage{g, p, i});  // leaves the table, keeps its reference until free
        ++q.held_in[g];
      } else {
        store_.release(g, p, i >= touch_lo && c > c0 ? step_ : q.last_step, q.prio);
      }
      grp.table.set(s, static_cast<std::uint32_t>(i), kNullPage);
    }
    q.lo[g] = new_lo;
  }
}

// Encoder groups: image pages are cached at the first commit; vision-embedding pages of
// images the prefill consumed are released (Jenga §6.2).
void ManagerCore::commit_images(std::uint32_t s, Request& q, std::uint64_t c) {
  const std::span<const MultimodalItem> items = q.ids.items();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (grp.decoder) continue;
    if (options_.prefix_caching && !q.enc_registered && c > 0) {
      for (std::uint32_t k = 0; k < items.size(); ++k)
        for (std::uint64_t i = q.item_page[g][k]; i < q.item_page[g][k + 1]; ++i)
          if (const PageId p = grp.table.pages(s)[i]; p != kNullPage)
            store_.register_page(g, p, q.ids.item_page_hash(k, i - q.item_page[g][k]));
    }
    if (!grp.image.release_when_consumed) continue;
    for (std::uint32_t k = q.items_consumed; k < items.size(); ++k) {
      if (items[k].offset + items[k].length > c) break;
      for (std::uint64_t i = q.item_page[g][k + 1]; i-- > q.item_page[g][k];) {
        const PageId p = grp.table.pages(s)[i];
        if (p == kNullPage) continue;
        store_.release(g, p, step_, q.prio);
        grp.table.set(s, static_cast<std::uint32_t>(i), kNullPage);
      }
    }
  }
  if (c > 0) q.enc_registered = true;
  while (q.items_consumed < items.size() && items[q.items_consumed].offset + items[q.items_consumed].length <= c)
    ++q.items_consumed;
}

// Everything commit refuses, checked before it changes anything (also alone: check_commit).
void ManagerCore::check_commit_at(RequestId r, std::uint32_t s, std::uint64_t c) const {
  const Request& q = reqs_[s];
  const std::uint64_t c0 = q.computed;
  if (q.loading) [[unlikely]]
    loading_error(r, "commit");
  if (c < c0) fail("num_computed_tokens = {}: request {} already has {} computed", c, r, c0);
  if (c > q.allocated) fail("num_computed_tokens = {}: request {} has pages for {} tokens only", c, r, q.allocated);
  if (q.hit_pending) fail("request = {}: commit before the allocate that pins its prefix hit", r);
  if (options_.prefix_caching && c > q.ids.num_tokens())
    fail("num_computed_tokens = {}: request {} has {} token ids (append_tokens first)", c, r, q.ids.num_tokens());
  if (c > c0) check_shared_write(r, s, q, c);
}

void ManagerCore::commit_at(RequestId r, std::uint32_t s, std::uint64_t num_computed_tokens) {
  Request& q = reqs_[s];
  const std::uint64_t c = num_computed_tokens, c0 = q.computed;
  check_commit_at(r, s, c);
  if (options_.prefix_caching) register_full_pages(s, q, c);
  if (q.bounds.tail_hi() > 0 && c > q.bounds.tail_end()) drop_tail(q);
  release_out_of_window(s, q, c0, c);
  if (!q.ids.items().empty() && q.enc_ready) commit_images(s, q, c);
  q.computed = c;
  if (c > c0) q.last_step = step_;
  expensive_check();
}

// ---------------------------------------------------------------- fork, free, reset

RequestId ManagerCore::fork(RequestId parent) {
  const std::uint32_t ps = running(parent);
  if (reqs_.full()) fail("fork: all max_requests = {} rows are active", reqs_.capacity());
  if (reqs_[ps].hit_pending) fail("request = {}: fork before the allocate that pins its prefix hit", parent);
  if (reqs_[ps].loading) loading_error(parent, "fork");
  const std::uint32_t s = reqs_.next_row();
  const Request& pq = reqs_[ps];
  Request& q = reqs_[s];
  q.swapped = q.hit_pending = false;
  q.looked_up = true;
  q.hit = pq.hit;
  q.enc_ready = pq.enc_ready;
  q.enc_registered = pq.enc_registered;
  q.ids = pq.ids;
  q.item_rank = pq.item_rank;
  q.prio = pq.prio;
  q.computed = q.allocated = q.step_end = pq.computed;
  q.last_step = pq.last_step;
  q.admitted = pq.admitted;
  q.items_consumed = pq.items_consumed;
  q.item_cached = pq.item_cached;
  q.item_page = pq.item_page;
  q.bounds = pq.bounds;  // the pages the parent holds stay the parent's
  q.held.clear();
  std::fill(q.held_in.begin(), q.held_in.end(), 0);
  q.branch = pq.branch;
  q.clear_tier();  // a recycled row may hold its previous request's (freed before its allocate)
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    const std::span<const PageId> pages = grp.table.pages(ps);
    const std::size_t k =
        grp.decoder ? std::min<std::size_t>(pages.size(), pages_for(pq.computed, grp.P)) : pages.size();
    for (std::size_t i = 0; i < k; ++i) {
      grp.table.append(s, pages[i]);
      if (pages[i] != kNullPage) ++grp.pg[pages[i]].ref;
    }
    grp.table.set_num_tokens(s, grp.decoder ? pq.computed : grp.table.num_tokens(ps));
    q.registered[g] = std::min<std::uint64_t>(pq.registered[g], k);
    q.lo[g] = std::min<std::uint64_t>(pq.lo[g], k);
  }
  const RequestId r = reqs_.take();
  expensive_check();
  return r;
}

// Last page first: within one step the longest prefix is evicted first, so the evictor
// appends at its tail in O(1).
void ManagerCore::release_rows(std::uint32_t s, Request& q) {
  release_held(q);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    store_.release_row(g, grp.table.pages(s), q.last_step, q.prio);
    grp.alloc.release_request(s);
    grp.table.clear(s);
  }
}

// Device pages, or host pages if swapped out.
void ManagerCore::release_all(std::uint32_t s, Request& q) {
  if (q.swapped) {
    for (Group& grp : groups_) {
      for (PageId h : grp.host_table.pages(s))
        if (h != kNullPage) grp.host_alloc.free(h);
      grp.host_alloc.release_request(s);
      grp.host_table.clear(s);
    }
  } else {
    release_rows(s, q);
  }
  q.swapped = q.hit_pending = false;
}

void ManagerCore::free(RequestId r) {
  const std::uint32_t s = reqs_.row(r);
  release_all(s, reqs_[s]);
  reqs_.give_back(s);
  expensive_check();
}

void ManagerCore::reset(RequestId r) {
  const std::uint32_t s = reqs_.row(r);
  Request& q = reqs_[s];
  release_all(s, q);
  q.looked_up = q.enc_ready = q.enc_registered = q.admitted = false;
  q.was_reset = true;
  q.hit = 0;
  clear_progress(q);
  // As a new request: its images get new random prefix lengths.
  for (std::uint64_t& rank : q.item_rank) rank = next_rank();
  expensive_check();
}

// ---------------------------------------------------------------- boundary-aware retention

void ManagerCore::update_anchor() {
  anchor_ = kNoGroup;
  for (GroupId g = 0; g < groups_.size() && anchor_ == kNoGroup; ++g)
    if (groups_[g].decoder && groups_[g].whole_prefix) anchor_ = g;
}

// Hinted boundaries replace the row's; the held list is reserved for them (a sliding
// window's w / P + 1 pages per boundary), so holding them never touches the heap mid-step.
void ManagerCore::set_boundaries(Request& q, std::span<const std::uint64_t> hinted, std::uint64_t prompt) {
  q.bounds.clear();
  q.held.clear();
  std::fill(q.held_in.begin(), q.held_in.end(), 0);
  for (std::uint64_t L : hinted) q.bounds.add(L);
  const std::uint64_t tail = options_.prefix_caching ? options_.prompt_tail_tokens : 0;
  if (tail > 0 && prompt > 0) q.bounds.set_tail(prompt > tail ? prompt - tail : 1, prompt, prompt + tail);
  // Room for every page the boundaries may hold (a bound, not the count): no heap use
  // when pages leave the windows.
  std::uint64_t most = 0;
  auto room = [&](const Group& grp, std::uint64_t lo, std::uint64_t hi) {
    const std::uint64_t pages = hi / grp.P;
    most += pages - std::min(pages, grp.policy->first_required_page(lo / grp.P * grp.P));
  };
  for (const Group& grp : groups_) {
    if (!grp.decoder) continue;
    for (std::uint64_t L : hinted) room(grp, L, L);
    if (q.bounds.tail_hi() > 0 && !grp.spec.is_state()) room(grp, q.bounds.tail_lo(), q.bounds.tail_hi());
  }
  q.held.reserve(most);
}

// At its first admission: a whole-prefix hit longer than the hit every group allowed is a
// branch point (learned, and held by this request, which recomputes up to it); a hit that
// ends at a learned point is held again, so the prefix stays findable after this request.
void ManagerCore::learn_at_admission(Request& q) {
  if (!branches_.enabled() || anchor_ == kNoGroup) return;
  const Group& a = groups_[anchor_];
  // A preempted request's own pages are not another request's prefix: where they part from
  // the hit says nothing about what others share.
  if (q.was_reset) return;
  const std::span<const BlockHash> chain = q.ids.chain(a.hash_class);
  if (const std::uint64_t pages = q.branch / a.P; q.branch > q.hit && pages > 0 && pages <= chain.size()) {
    branches_.insert(chain[pages - 1]);
    q.bounds.add(pages * a.P);
  }
  if (const std::uint64_t pages = q.hit / a.P;
      pages > 0 && pages <= chain.size() && branches_.contains(chain[pages - 1]))
    q.bounds.add(pages * a.P);
}

// The anchor group's pages [from, full) just registered: a learned point among them is a
// boundary of this request.
void ManagerCore::learn_on_register(Request& q, const BlockHash* hv, std::uint64_t from, std::uint64_t full) {
  for (std::uint64_t i = from; i < full; ++i)
    if (branches_.contains(hv[i])) q.bounds.add((i + 1) * groups_[anchor_].P);
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
void ManagerCore::drop_tail(Request& q) {
  q.bounds.set_tail(0, 0, 0);
  auto tail_only = [&](const HeldPage& h) { return !q.bounds.held(*groups_[h.group].policy, h.index, false); };
  for (std::size_t k = q.held.size(); k-- > 0;) {
    if (!tail_only(q.held[k])) continue;
    store_.release(q.held[k].group, q.held[k].page, step_, q.prio);
    --q.held_in[q.held[k].group];
  }
  std::erase_if(q.held, tail_only);
}

void ManagerCore::release_held(Request& q) {
  for (auto it = q.held.rbegin(); it != q.held.rend(); ++it) store_.release(it->group, it->page, q.last_step, q.prio);
  q.held.clear();
  std::fill(q.held_in.begin(), q.held_in.end(), 0);
}

// ---------------------------------------------------------------- cache control

void ManagerCore::reset_prefix_cache() {
  // Swapped-out pages come back private: their pre-reset content is not cached again.
  for (Group& grp : groups_) std::fill(grp.host_hashed.begin(), grp.host_hashed.end(), std::uint8_t{0});
  store_.forget_all();
  branches_.clear();
  log(LogLevel::kInfo, "reset_prefix_cache: every cached hash forgotten");
  expensive_check();
}

PinId ManagerCore::pin_prefix(RequestId r) {
  const std::uint32_t s = running(r);
  PinId id;
  if (!free_pins_.empty()) {
    id = free_pins_.back();
    free_pins_.pop_back();
  } else {
    id = static_cast<PinId>(pins_.size());
    pins_.emplace_back();
  }
  auto& held = pins_[id];
  held.clear();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    for (PageId p : grp.table.pages(s)) {
      if (p == kNullPage || !grp.pg[p].hashed) continue;
      ++grp.pg[p].ref;
      held.emplace_back(g, p);
    }
  }
  return id;
}

void ManagerCore::unpin(PinId pin) {
  if (pin >= pins_.size() || std::find(free_pins_.begin(), free_pins_.end(), pin) != free_pins_.end())
    fail("pin = {}: not an active pin", pin);
  for (auto it = pins_[pin].rbegin(); it != pins_[pin].rend(); ++it) store_.release(it->first, it->second, step_, 0);
  pins_[pin].clear();
  free_pins_.push_back(pin);
  expensive_check();
}

}  // namespace kvmm::detail
