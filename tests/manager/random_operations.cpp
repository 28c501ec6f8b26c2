// The randomized test's operations (reference_model.hpp): add with or without a lookup, a
// refused admission, reset, lookup and pin, a step (allocate, copy-on-write, commit),
// free, fork, swap out and in, prefix pins, prefix-cache reset; each one's outcome checked
// against the reference model.
#include "reference_model.hpp"

#include "kvmm/testing/manager_inspector.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

namespace kvmm::test {

// ---- operations
void Model::op_add(bool always_lookup, bool pin) {
  last_op_ = "op_add";
  if (reqs_.size() >= kMaxRequests) return;
  RefRequest q;
  const auto& base = bases_[rng_() % 2];
  q.tokens.assign(base.begin(), base.begin() + 1 + static_cast<long>(rng_() % base.size()));
  for (std::uint64_t k = rng_() % 6; k > 0; --k) q.tokens.push_back(static_cast<std::uint32_t>(rng_() % 3));
  q.lora = rng_() % 8 == 0 ? 1 : 0;
  for (std::uint64_t k = rng_() % 2 ? 1 + rng_() % 3 : 0; k > 0; --k) q.bounds.push_back(1 + rng_() % q.tokens.size());
  std::sort(q.bounds.begin(), q.bounds.end());
  q.bounds.erase(std::unique(q.bounds.begin(), q.bounds.end()), q.bounds.end());
  q.prompt = q.tokens.size();
  const RequestId r = kv_.add_request(
      q.tokens, {.lora_id = q.lora, .priority = static_cast<std::uint32_t>(rng_() % 2), .cache_boundaries = q.bounds});
  REQUIRE_FALSE(reqs_.count(r));
  reqs_[r] = q;
  last_added_ = r;
  if (!always_lookup && rng_() % 10 == 0) return;  // no lookup: allocates from scratch
  lookup(r, pin);
}

// A scheduler's refused admission: a lookup (pure), other requests change pages
// meanwhile (or not), an allocation beyond all memory that changes nothing (the hit is
// not pinned), reset; the model must match.
void Model::op_refuse() {
  if (reqs_.size() >= kMaxRequests) return;
  op_add(true, false);  // the hit stays unpinned: the refused allocate must not pin it
  const RequestId r = last_added_;
  for (std::uint64_t k = rng_() % 3; k > 0; --k) {
    after_op();
    before_op();
    std::vector<RequestId> others;
    for (const auto& [o, q] : reqs_)
      if (o != r && !q.swapped) others.push_back(o);
    if (others.empty()) break;
    const RequestId o = others[rng_() % others.size()];
    if (rng_() % 2)
      op_free(o);
    else
      op_step(o);
  }
  after_op();
  before_op();
  last_op_ = "op_refuse";
  const Snap s = snap();
  const std::uint64_t evicted = evictions;
  REQUIRE_FALSE(kv_.allocate(r, 1u << 20));
  // Nothing changed but, if pages were held for retention, their release (pressure).
  const bool released = released_held(r);
  take_events();
  settle_released();
  REQUIRE(evictions == evicted);
  if (released)
    REQUIRE(snap().tables == s.tables);
  else
    REQUIRE(snap() == s);
  ++refusals;
  op_reset(r);
}

// Preemption by recompute that keeps the request: every page released, ids and hashes
// kept; a later lookup must hit exactly as a new request with the same ids would.
void Model::op_reset(RequestId r) {
  last_op_ = "op_reset";
  kv_.reset(r);
  take_events();
  ++resets;
  RefRequest& q = reqs_[r];
  q.swapped = false;
  q.admitted = false;
  for (GroupId g = 0; g < ng_; ++g) {
    q.registered[g] = 0;
    REQUIRE(kv_.page_table(r, g).empty());
  }
  REQUIRE(kv_.num_computed(r) == 0);
  REQUIRE(kv_.num_tokens(r) == q.tokens.size());
  q.held.clear();  // released with the rows
  q.held_index.clear();
  REQUIRE(kvmm::testing::ManagerInspector(kv_).held_pages(r).empty());
  if (rng_() % 4 == 0) return;  // allocates from scratch
  after_op();
  before_op();
  lookup(r);
}

void Model::lookup(RequestId r, bool pin) {
  const std::uint64_t want = expected_hit(reqs_[r]);
  const std::uint64_t got = kv_.lookup_prefix(r);
  ++lookups;
  hits += got > 0;
  REQUIRE(got == want);
  REQUIRE(kv_.num_computed(r) == got);
  check_report(r, got);
  // lookup_prefix is pure: no row changes until allocate pins the hit.
  for (GroupId g = 0; g < ng_; ++g) REQUIRE(kv_.page_table(r, g).empty());
  if (!pin) return;
  REQUIRE(kv_.allocate(r, 0));
  reqs_[r].admitted = true;
  // The hit maps exactly the pages the policies require, the rest is null.
  const auto h4 = chain(reqs_[r], 4, hasher_), h8 = chain(reqs_[r], 8, hasher_);
  const std::uint64_t lo[kMaxGroups] = {0, (got > kWindow ? got - kWindow : 0) / 4, got >= 8 ? got / 8 - 1 : 0, 0};
  for (GroupId g = 0; g < ng_; ++g) {
    const auto t = kv_.page_table(r, g);
    REQUIRE(t.size() == got / kP[g]);
    for (std::uint64_t i = 0; i < t.size(); ++i) {
      if (i < lo[g]) {
        REQUIRE(t[i] == kNullPage);
      } else {
        REQUIRE(t[i] == cached_[g].at(key((g == kMamba ? h8 : h4)[i])));
      }
    }
    reqs_[r].registered[g] = got / kP[g];
  }
}

void Model::op_step(RequestId r) {
  last_op_ = "op_step";
  RefRequest& q = reqs_[r];
  const std::uint64_t computed = kv_.num_computed(r);
  if (computed >= 64) return op_free(r);
  std::uint32_t n;
  if (computed < q.tokens.size()) {
    n = 1 + static_cast<std::uint32_t>(rng_() % std::min<std::uint64_t>(q.tokens.size() - computed, 12));
  } else {
    const auto t = static_cast<std::uint32_t>(rng_() % 50);
    kv_.append_token(r, t);
    q.tokens.push_back(t);
    n = 1;
  }
  const std::uint32_t lookahead = rng_() % 4 == 0 ? static_cast<std::uint32_t>(rng_() % 3) : 0;
  // What the pool alone can serve must never fail.
  const std::uint64_t target = computed + n + lookahead;
  std::uint64_t large_needed = 0;
  std::uint64_t need_of[kMaxGroups] = {0, 0, 0, 0};
  for (GroupId g = 0; g < ng_; ++g) {
    const auto t = kv_.page_table(r, g);
    std::uint64_t need = 0;
    if (target > kv_.num_allocated(r)) {
      const std::uint64_t want = (target + kP[g] - 1) / kP[g];
      need = want > t.size() ? want - t.size() : 0;
    }
    if (computed % kP[g] && computed / kP[g] < t.size() && t[computed / kP[g]] != kNullPage &&
        kvmm::testing::ManagerInspector(kv_).ref_count(g, t[computed / kP[g]]) > 1)
      ++need;
    need_of[g] = need;
    large_needed += (need + n_[g] - 1) / n_[g];
  }
  // What the pool and the reclaimable large pages can serve must never fail either:
  // wholly evictable ones (Jenga §5.4 step 3) and, of groups that need nothing (whose
  // steps 1 and 4 cannot take a slot of them first), ones of cached and empty slots
  // with nothing used (step 6).
  // Retention's pages are evictable under pressure: counted as the cached pages they
  // become (those held and used by nothing else, hashed), the bound must hold as well.
  std::vector<std::uint32_t> held_refs[kMaxGroups];
  for (GroupId g = 0; g < ng_; ++g) held_refs[g].assign(pages(g), 0);
  for (const auto& [o, oq] : reqs_)  // those retention_release may release: a running r's only
    if (q.admitted && (release_ == RetentionRelease::kAll || (release_ == RetentionRelease::kOwn && o == r)))
      for (const auto& [g, p] : oq.held) ++held_refs[g][p];
  std::uint64_t reclaimable = 0, reclaimable_released = 0;
  for (std::uint32_t lp = 0; lp < kv_.large_pages().capacity(); ++lp) {
    const GroupId h = kv_.large_pages().owner(LargePageId{lp});
    if (h == kNoGroup) continue;
    std::uint32_t used = 0, cached = 0, held_only = 0;
    for (PageId sp = lp * n_[h]; sp < (lp + 1) * n_[h]; ++sp) {
      used += kvmm::testing::ManagerInspector(kv_).page_state(h, sp) == PageState::kUsed;
      cached += kvmm::testing::ManagerInspector(kv_).page_state(h, sp) == PageState::kEvictable;
      held_only += held_refs[h][sp] > 0 && held_refs[h][sp] == refs_[h][sp] && page_hash_[h].count(sp);
    }
    reclaimable += cached == n_[h] || (used == 0 && cached > 0 && need_of[h] == 0);
    used -= held_only;
    cached += held_only;
    reclaimable_released += cached == n_[h] || (used == 0 && cached > 0 && need_of[h] == 0);
  }
  const bool must_fit = large_needed <= kv_.large_pages().num_free() + reclaimable;
  const bool must_fit_released = large_needed <= kv_.large_pages().num_free() + reclaimable_released;
  const Snap s = snap();
  const std::uint64_t evicted = evictions;
  const bool ok = static_cast<bool>(kv_.allocate(r, n, lookahead));
  const bool released = released_held(r);
  take_events();
  settle_released();
  if (released) REQUIRE(q.admitted);
  if (released) REQUIRE_FALSE(must_fit);  // only when memory as it stood could not serve it
  if (!ok) {
    ++failures;
    REQUIRE_FALSE(must_fit);
    REQUIRE_FALSE(must_fit_released);
    REQUIRE(evictions == evicted);
    if (released) {
      REQUIRE(snap().tables == s.tables);
    } else {
      REQUIRE(snap() == s);
      REQUIRE(events_.empty());
    }
    // The scheduler preempts: swap the request out, reset it or drop it (recompute later).
    const std::uint64_t choice = rng_() % 3;
    if (choice < 2) {
      after_op();
      before_op();
      if (choice == 0)
        op_swap_out(r);
      else
        op_reset(r);
    }
    return;
  }
  q.admitted = true;
  // Copy-on-write: each copy replaced a shared page at the write position.
  for (const PageCopy& c : kv_.copies()) {
    ++cows;
    const auto before = tables_before_.at({r, c.group});
    const std::uint64_t idx = computed / kP[c.group];
    REQUIRE(before.at(idx) == c.src);
    REQUIRE(kv_.page_table(r, c.group)[idx] == c.dst);
    REQUIRE(kvmm::testing::ManagerInspector(kv_).ref_count(c.group, c.dst) == 1);
  }
  kv_.begin_step();
  // Commit what was computed (sometimes less); full pages become cached.
  std::uint64_t c = computed + n;
  if (rng_() % 8 == 0) c = computed + rng_() % (n + 1);
  for (GroupId g = 0; g < ng_; ++g)
    tables_before_[{r, g}] = std::vector<PageId>(kv_.page_table(r, g).begin(), kv_.page_table(r, g).end());
  kv_.commit(r, c);
  take_events();
  const auto h4 = chain(q, 4, hasher_), h8 = chain(q, 8, hasher_);
  for (GroupId g = 0; g < ng_; ++g) {
    const auto& before = tables_before_.at({r, g});
    const auto& h = g == kMamba ? h8 : h4;
    for (std::uint64_t i = q.registered[g]; i < c / kP[g]; ++i)
      if (before[i] != kNullPage) remember(g, before[i], h[i]);
    q.registered[g] = std::max<std::uint64_t>(q.registered[g], c / kP[g]);
  }
  check_held(r, q);
}

void Model::op_free(RequestId r) {
  last_op_ = "op_free";
  for (auto it = pins_.begin(); it != pins_.end();) {
    if (rng_() % 2) {
      kv_.unpin(it->first);
      it = pins_.erase(it);
      take_events();
    } else {
      ++it;
    }
  }
  kv_.free(r);
  reqs_.erase(r);
  take_events();
}

void Model::op_fork() {
  last_op_ = "op_fork";
  const auto pr = pick(false);
  if (!pr || reqs_.size() >= kMaxRequests || kv_.num_computed(*pr) == 0) return;
  const RequestId c = kv_.fork(*pr);
  RefRequest q = reqs_[*pr];
  const std::uint64_t computed = kv_.num_computed(*pr);
  for (GroupId g = 0; g < ng_; ++g) {
    const auto pt = kv_.page_table(*pr, g), ct = kv_.page_table(c, g);
    REQUIRE(ct.size() == (computed + kP[g] - 1) / kP[g]);
    for (std::size_t i = 0; i < ct.size(); ++i) REQUIRE(ct[i] == pt[i]);
    q.registered[g] = std::min<std::uint64_t>(q.registered[g], ct.size());
  }
  q.held.clear();  // the parent's stay the parent's
  q.held_index.clear();
  reqs_[c] = q;
}

void Model::op_swap_out(RequestId r) {
  last_op_ = "op_swap_out";
  const Snap s = snap();
  std::size_t held = 0;
  for (GroupId g = 0; g < ng_; ++g)
    for (PageId p : kv_.page_table(r, g)) held += p != kNullPage;
  const auto plan = kv_.swap_out(r);
  if (!plan) {
    take_events();
    REQUIRE(snap() == s);
    return;
  }
  ++swaps;
  REQUIRE(plan->size() == held);
  RefRequest& q = reqs_[r];
  q.swapped = true;
  q.held.clear();  // released, not swapped: they serve later hits, not this request
  q.held_index.clear();
  // The hashes the host copies carry: as cached before this operation's events (a page
  // released here may hand its hash to a copy).
  for (GroupId g = 0; g < ng_; ++g) {
    q.swapped_hash[g].clear();
    q.swapped_null[g].clear();
    for (PageId p : tables_before_.at({r, g})) {
      q.swapped_null[g].push_back(p == kNullPage);
      if (p == kNullPage) {
        q.swapped_hash[g].push_back(std::nullopt);
      } else {
        const auto it = page_hash_[g].find(p);
        q.swapped_hash[g].push_back(it == page_hash_[g].end() ? std::nullopt : std::optional(it->second));
      }
    }
  }
  take_events();
}

void Model::op_swap_in() {
  last_op_ = "op_swap_in";
  const auto pr = pick(true);
  if (!pr) return;
  const RequestId r = *pr;
  const Snap s = snap();
  const auto plan = kv_.swap_in(r);
  take_events();
  if (!plan) {
    REQUIRE(snap() == s);
    REQUIRE(events_.empty());
    return;
  }
  RefRequest& q = reqs_[r];
  q.swapped = false;
  for (GroupId g = 0; g < ng_; ++g) {
    const auto t = kv_.page_table(r, g);
    REQUIRE(t.size() == q.swapped_hash[g].size());
    for (std::size_t i = 0; i < t.size(); ++i) {
      REQUIRE((t[i] == kNullPage) == q.swapped_null[g][i]);
      if (t[i] != kNullPage && q.swapped_hash[g][i]) remember(g, t[i], *q.swapped_hash[g][i]);
    }
  }
}

void Model::op_pin() {
  last_op_ = "op_pin";
  const auto pr = pick(false);
  if (!pr || pins_.size() > 3) return;
  std::vector<std::pair<GroupId, PageId>> held;
  for (GroupId g = 0; g < ng_; ++g)
    for (PageId p : kv_.page_table(*pr, g))
      if (p != kNullPage && page_hash_[g].count(p)) held.emplace_back(g, p);
  pins_[kv_.pin_prefix(*pr)] = held;
}

void Model::one_op() {
  const std::uint64_t x = rng_() % 1000;
  if (x < 150) {
    op_add();
  } else if (x < 700) {
    op_step();
  } else if (x < 780) {
    if (const auto r = pick(rng_() % 4 == 0)) op_free(*r);
  } else if (x < 800) {
    if (const auto r = pick(rng_() % 4 == 0)) op_reset(*r);
  } else if (x < 860) {
    op_fork();
  } else if (x < 900) {
    op_swap_out();
  } else if (x < 950) {
    op_swap_in();
  } else if (x < 980) {
    op_pin();
  } else if (x < 990) {
    kv_.begin_step();
  } else if (x < 998) {
    op_refuse();
  } else {
    kv_.reset_prefix_cache();
    // Swapped-out pages come back private: the reset forgets their hashes too.
    for (auto& [r, q] : reqs_)
      for (auto& hashes : q.swapped_hash)
        for (auto& h : hashes) h.reset();
    take_events(/*resetting=*/true);
    for (GroupId g = 0; g < ng_; ++g) REQUIRE(cached_[g].empty());
  }
}

}  // namespace kvmm::test
