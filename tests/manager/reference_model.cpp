// The randomized test's reference model (reference_model.hpp): the manager built as the
// model describes it, the model's own hashes and hits, reference counts and page states
// recomputed from the page tables, the events checked against what the model held
// evictable, snapshots for all-or-none failures, and the held pages a commit must leave.
#include "reference_model.hpp"

#include "kvmm/testing/manager_inspector.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

namespace kvmm::test {

Model::Model(std::uint64_t seed, std::uint32_t large_pages, int layout, std::uint32_t learned, std::uint32_t tail,
             const BlockHashOptions& block_hash, bool pack, double budget, RetentionRelease release)
    : rng_(seed),
      tail_(tail),
      hasher_(block_hash),
      kv_(random_layout(layout), {.num_large_pages = large_pages,
                                  .num_host_large_pages = 6,
                                  .max_requests = kMaxRequests,
                                  .record_events = true,
                                  .learned_boundaries = learned,
                                  .pack_small_pages = pack,
                                  .prompt_tail_tokens = tail,
                                  .learned_tail_tokens = 0,  // the model holds the fixed tail
                                  .retention_budget = budget,
                                  .retention_release = release,
                                  .block_hash = block_hash,
                                  .miss_reasons = 64}) {
  release_ = release;
  budget_ = static_cast<std::uint64_t>(budget * static_cast<double>(large_pages) *
                                       static_cast<double>(kv_.layout().large_page_bytes()));
  ng_ = static_cast<GroupId>(kv_.layout().num_groups());
  for (GroupId g = 0; g < ng_; ++g) n_[g] = kv_.layout().small_pages_per_large_page(g);
  for (auto& base : bases_) {
    base.resize(40);
    for (auto& t : base) t = static_cast<std::uint32_t>(rng_() % 50);
  }
}

void Model::run(int ops) {
  for (int i = 0; i < ops; ++i) {
    op_index_ = i;
    before_op();
    one_op();
    after_op();
  }
}

// ---- reference hashes and hits
bool Model::cached(GroupId g, const std::vector<BlockHash>& h, std::uint64_t i) const {
  return i < h.size() && cached_[g].count(key(h[i]));
}

std::uint64_t Model::expected_hit(const RefRequest& q) const {
  if (q.tokens.size() <= 1) return 0;
  const auto h4 = chain(q, 4, hasher_), h8 = chain(q, 8, hasher_);
  for (std::uint64_t p = q.tokens.size() - 1; p > 0; --p) {
    if (p % 8) continue;
    bool ok = true;
    for (std::uint64_t i = 0; i < p / 4 && ok; ++i) ok = cached(kFull, h4, i);
    for (std::uint64_t i = (p > kWindow ? p - kWindow : 0) / 4; i < p / 4 && ok; ++i) ok = cached(kSw, h4, i);
    ok = ok && cached(kMamba, h8, p / 8 - 1);
    for (std::uint64_t i = 0; ng_ > kIndexer && i < p / 4 && ok; ++i) ok = cached(kIndexer, h4, i);
    if (ok) return p;
  }
  return 0;
}

// ---- reference counts and states, recomputed from the page tables and pins
void Model::count_refs() {
  for (GroupId g = 0; g < ng_; ++g) refs_[g].assign(pages(g), 0);
  for (const auto& [r, q] : reqs_) {
    if (q.swapped) continue;
    for (GroupId g = 0; g < ng_; ++g)
      for (PageId x : kv_.page_table(r, g))
        if (x != kNullPage) ++refs_[g][x];
    for (const auto& [g, x] : q.held) ++refs_[g][x];
  }
  for (const auto& [id, held] : pins_)
    for (const auto& [pg, x] : held) ++refs_[pg][x];
}

void Model::before_op() {
  for (auto& r : released_) r.clear();
  count_refs();
  for (GroupId g = 0; g < ng_; ++g) {
    evictable_[g].clear();
    for (const auto& [p, h] : page_hash_[g])
      if (refs_[g][p] == 0) evictable_[g].insert(p);
  }
  tables_before_.clear();
  for (const auto& [r, q] : reqs_)
    for (GroupId g = 0; g < ng_; ++g) {
      const auto t = kv_.page_table(r, g);
      tables_before_[{r, g}] = std::vector<PageId>(t.begin(), t.end());
    }
}

void Model::forget(GroupId g, PageId p) {
  const auto it = page_hash_[g].find(p);
  REQUIRE(it != page_hash_[g].end());
  cached_[g].erase(key(it->second));
  page_hash_[g].erase(it);
}

void Model::remember(GroupId g, PageId p, const BlockHash& h) {
  if (cached_[g].count(key(h)) || page_hash_[g].count(p)) return;
  cached_[g][key(h)] = p;
  page_hash_[g][p] = h;
}

// Removed events: only pages the model held evictable before the operation.
void Model::take_events(bool resetting) {
  kv_.take_events(events_);
  for (std::size_t i = 0; i < events_.size(); ++i) {
    const CacheEvent& e = events_[i];
    if (e.kind != CacheEventKind::kRemoved) continue;
    REQUIRE(page_hash_[e.group].count(e.page));
    REQUIRE(page_hash_[e.group].at(e.page) == e.hash);
    forget(e.group, e.page);
    if (resetting) continue;
    INFO("group " << e.group << " page " << e.page);
    // A page retention released this operation: evicted, or handed over to its copy.
    const bool handed = i + 1 < events_.size() && events_[i + 1].kind == CacheEventKind::kStored &&
                        events_[i + 1].group == e.group && events_[i + 1].hash == e.hash;
    if (evictable_[e.group].count(e.page) || (released_[e.group].count(e.page) && !handed)) {
      ++evictions;
      continue;
    }
    // A used page released during the operation hands its hash to a copy of the same
    // content that a running request uses: removed, then stored for the copy.
    REQUIRE(i + 1 < events_.size());
    const CacheEvent& s = events_[++i];
    REQUIRE(s.kind == CacheEventKind::kStored);
    REQUIRE(s.group == e.group);
    REQUIRE(s.hash == e.hash);
    REQUIRE(refs_[s.group][s.page] > 0);
    remember(s.group, s.page, s.hash);
    ++handovers;
  }
}

void Model::after_op() {
  INFO("op " << op_index_ << " " << last_op_);
  count_refs();
  for (GroupId g = 0; g < ng_; ++g) {
    for (PageId p = 0; p < pages(g); ++p) {
      const std::optional<BlockHash> h = kvmm::testing::ManagerInspector(kv_).page_hash(g, p);
      const auto it = page_hash_[g].find(p);
      const bool ok = h.has_value() == (it != page_hash_[g].end()) && (!h || *h == it->second) &&
                      (!h || kv_.small_pages(g).is_allocated(p)) &&  // never cached and free
                      kvmm::testing::ManagerInspector(kv_).ref_count(g, p) == refs_[g][p] &&
                      kvmm::testing::ManagerInspector(kv_).page_state(g, p) == state(g, p);
      if (ok) continue;
      INFO("group " << g << " page " << p);
      REQUIRE(h.has_value() == (it != page_hash_[g].end()));
      if (h) REQUIRE(*h == it->second);
      if (h) REQUIRE(kv_.small_pages(g).is_allocated(p));
      REQUIRE(kvmm::testing::ManagerInspector(kv_).ref_count(g, p) == refs_[g][p]);
      REQUIRE(kvmm::testing::ManagerInspector(kv_).page_state(g, p) == state(g, p));
    }
  }
  // Retention: what the manager counts held is what the model holds, within the bound.
  REQUIRE(kv_.counters().retention_bytes == held_bytes());
  REQUIRE(held_bytes() <= budget_);
  kv_.check_invariants();
}

Model::Snap Model::snap() const {
  Snap s;
  for (const auto& [r, q] : reqs_)
    for (GroupId g = 0; g < ng_; ++g) {
      const auto t = kv_.page_table(r, g);
      s.tables[{r, g}] = std::vector<PageId>(t.begin(), t.end());
    }
  for (GroupId g = 0; g < ng_; ++g)
    for (PageId p = 0; p < pages(g); ++p) {
      s.refs.push_back(kvmm::testing::ManagerInspector(kv_).ref_count(g, p));
      s.states.push_back(kvmm::testing::ManagerInspector(kv_).page_state(g, p));
    }
  s.free_large = kv_.large_pages().num_free();
  return s;
}

std::optional<RequestId> Model::pick(bool swapped) {
  std::vector<RequestId> c;
  for (const auto& [r, q] : reqs_)
    if (q.swapped == swapped) c.push_back(r);
  if (c.empty()) return std::nullopt;
  return c[rng_() % c.size()];
}

// The miss report agrees with the lookup: the hit, the limit, every decoder group's own
// hit at least the hit, the named group's the least of them, kNone exactly at the limit.
void Model::check_report(RequestId r, std::uint64_t got) {
  const LookupReport& rep = kv_.lookup_report(r);
  const std::uint64_t n = reqs_[r].tokens.size();
  REQUIRE(rep.hit_tokens == got);
  REQUIRE(rep.limit == (n > 1 ? n - 1 : 0));
  REQUIRE((rep.reason == MissReason::kNone) == (got == rep.limit));
  REQUIRE(rep.groups.size() == ng_);
  for (GroupId g = 0; g < ng_; ++g) {
    REQUIRE(rep.groups[g].hit_tokens >= got);
    REQUIRE(rep.groups[g].hit_tokens <= rep.limit);
    REQUIRE((rep.groups[g].reason == MissReason::kNone) == (rep.groups[g].hit_tokens == rep.limit));
    if (rep.reason != MissReason::kNone) REQUIRE(rep.groups[rep.group].hit_tokens <= rep.groups[g].hit_tokens);
  }
  ++reports[static_cast<std::size_t>(rep.reason)];
}

// Pages that left r's tables in its last commit are held iff a boundary (hinted, or
// learned: the manager's list, which must contain the hinted ones; or, in the window
// group, any length within the prompt's last tail_ tokens until the request computed
// tail_ tokens past its prompt, when the pages only the tail held go) needs them.
void Model::check_held(RequestId r, RefRequest& q) {
  const std::vector<std::uint64_t> bounds = kvmm::testing::ManagerInspector(kv_).cache_boundaries(r);
  for (std::uint64_t L : q.bounds) REQUIRE(std::count(bounds.begin(), bounds.end(), L) == 1);
  if (tail_ > 0 && kv_.num_computed(r) > q.prompt + tail_) q.tail_dropped = true;
  const bool tail_on = tail_ > 0 && !q.tail_dropped;
  const std::uint64_t tail_lo = !tail_on ? 0 : q.prompt > tail_ ? q.prompt - tail_ : 1;
  REQUIRE(kvmm::testing::ManagerInspector(kv_).prompt_tail(r) ==
          std::pair<std::uint64_t, std::uint64_t>{tail_lo, tail_on ? q.prompt : 0});
  std::vector<std::uint64_t> with_tail = bounds;
  if (tail_on)
    for (std::uint64_t L = tail_lo; L <= q.prompt; ++L) with_tail.push_back(L);
  for (std::size_t k = q.held.size(); k-- > 0;)  // a dropped tail's pages go
    if (!held_by_rule(q.held[k].first, q.held_index[k], with_tail)) {
      q.held.erase(q.held.begin() + static_cast<std::ptrdiff_t>(k));
      q.held_index.erase(q.held_index.begin() + static_cast<std::ptrdiff_t>(k));
    }
  // Pages leave a window last first, each held while the bound (every request's held
  // pages together) has room for it.
  std::uint64_t bytes = held_bytes();
  for (GroupId g = 0; g < ng_; ++g) {
    const auto& before = tables_before_.at({r, g});
    const auto after = kv_.page_table(r, g);
    for (std::uint64_t i = std::min(before.size(), after.size()); i-- > 0;)
      if (before[i] != kNullPage && after[i] == kNullPage && held_by_rule(g, i, g == kMamba ? bounds : with_tail)) {
        if (bytes + kv_.layout().small_page_bytes(g) > budget_) {
          ++over_bound;
          continue;
        }
        bytes += kv_.layout().small_page_bytes(g);
        q.held.emplace_back(g, before[i]);
        q.held_index.push_back(i);
      }
  }
  auto got = kvmm::testing::ManagerInspector(kv_).held_pages(r), want = q.held;
  std::sort(got.begin(), got.end()), std::sort(want.begin(), want.end());
  REQUIRE(got == want);
  if (!q.held.empty()) ++holds;
}

std::uint64_t Model::held_bytes() const {
  std::uint64_t b = 0;
  for (const auto& [r, q] : reqs_)
    for (const auto& [g, p] : q.held) b += kv_.layout().small_page_bytes(g);
  return b;
}

bool Model::released_held(RequestId r) {
  std::vector<std::pair<GroupId, PageId>> released;
  for (auto& [o, q] : reqs_) {
    std::map<std::pair<GroupId, PageId>, std::uint32_t> now;  // what the manager still holds
    for (const auto& gp : kvmm::testing::ManagerInspector(kv_).held_pages(o)) ++now[gp];
    std::vector<std::pair<GroupId, PageId>> kept;
    std::vector<std::uint64_t> kept_index;
    for (std::size_t k = 0; k < q.held.size(); ++k) {
      if (auto it = now.find(q.held[k]); it != now.end() && it->second > 0) {
        --it->second;
        kept.push_back(q.held[k]);
        kept_index.push_back(q.held_index[k]);
      } else {
        released.push_back(q.held[k]);
      }
    }
    REQUIRE(kept.size() == kvmm::testing::ManagerInspector(kv_).held_pages(o).size());  // an allocate holds nothing new
    if (kept.size() == q.held.size()) continue;
    // Only as retention_release says: the allocating request's own (kOwn) or anyone's (kAll).
    REQUIRE(release_ != RetentionRelease::kOff);
    if (release_ == RetentionRelease::kOwn) REQUIRE(o == r);
    q.held = std::move(kept);
    q.held_index = std::move(kept_index);
  }
  if (released.empty()) return false;
  ++pressure_releases;
  // Evictable once released (cached then, perhaps by a hand-over from another released
  // page): no holder before the operation but the holds.
  std::map<std::pair<GroupId, PageId>, std::uint32_t> times;
  for (const auto& gp : released) ++times[gp];
  for (const auto& [gp, n] : times)
    if (refs_[gp.first][gp.second] == n) released_[gp.first].insert(gp.second);
  return true;
}

void Model::settle_released() {
  for (GroupId g = 0; g < ng_; ++g) {
    for (PageId p : released_[g])
      if (page_hash_[g].count(p)) evictable_[g].insert(p);
    released_[g].clear();
  }
}

}  // namespace kvmm::test
