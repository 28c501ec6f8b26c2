#include "prefix_lookup.hpp"

#include "draft_groups.hpp"
#include "kvmm/detail/debug_checks.hpp"
#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

namespace {

constexpr PageId kUnknown = kNullPage - 1;  // a memo entry not probed yet
constexpr std::uint64_t kNoProbe = ~std::uint64_t{0};

// Group g's cached pages as the index's hash_of: holds(p, h) when page p is cached under h
// (then the index maps h to p: check_invariants checks that every cached page is indexed).
struct Cached {
  const Group* grp;
  bool holds(std::uint64_t p, const BlockHash& h) const {
    return p < grp->pg.size() && grp->pg[p].hashed && grp->pg[p].hash == h;
  }
  const BlockHash& operator()(GroupId, PageId p) const { return grp->pg[p].hash; }
};

// Answers a policy's probes of one group from the request's page hashes, remembering every
// answer (page id or null) so repeated candidates cost an array read and the pin needs no
// second lookup. A known neighbour's page +-1 is tried first (a prefix cached by one
// prefill sits in consecutive ids; a page cached under the same hash is the index's own
// answer), else the index.
class IndexProbe final : public PageProbe {
 public:
  IndexProbe(const PrefixIndex& index, GroupId g, std::span<const BlockHash> hashes, std::vector<PageId>& memo,
             const Group& grp)
      : index_(index), g_(g), hashes_(hashes), memo_(memo), cached_{&grp} {}
  bool hit(std::uint64_t i) override { return page(i) != kNullPage; }
  PageId page(std::uint64_t i) {
    if (i >= memo_.size() || i >= hashes_.size()) return kNullPage;
    if (memo_[i] == kUnknown) memo_[i] = find(i);
    return memo_[i];
  }

 private:
  PageId find(std::uint64_t i) const {
    const BlockHash& h = hashes_[i];
    const bool down = i + 1 < memo_.size() && memo_[i + 1] < kUnknown;
    const bool up = i > 0 && memo_[i - 1] < kUnknown;
    // Scans run page by page up or down (a known neighbour tells which way; else both).
    if (!down) prefetch_probe(index_, g_, hashes_.data(), i, hashes_.size(), true);
    if (!up) prefetch_probe(index_, g_, hashes_.data(), i, hashes_.size(), false);
    PageId guess = kNullPage;
    if (down && memo_[i + 1] > 0 && cached_.holds(memo_[i + 1] - 1, h))
      guess = memo_[i + 1] - 1;
    else if (up && cached_.holds(std::uint64_t{memo_[i - 1]} + 1, h))
      guess = memo_[i - 1] + 1;
    if (guess == kNullPage) return index_.find(g_, h, cached_);
    if constexpr (kCheckInternal) {
      if (index_.find(g_, h, cached_) != guess)
        fail("debug check: group {} page {}: the neighbour guess {} is not the index's answer", g_, i, guess);
    }
    return guess;
  }
  const PrefixIndex& index_;
  GroupId g_;
  std::span<const BlockHash> hashes_;
  std::vector<PageId>& memo_;
  Cached cached_;
};

}  // namespace

PrefixLookup::PrefixLookup(std::vector<Group>& groups, PageStore& store, PrefixIndex& index)
    : groups_(groups),
      store_(store),
      index_(index),
      memo_(groups.size()),
      first_miss_(groups.size(), kNoProbe),
      accepted_(groups.size(), 0),
      draft_hit_(groups.size(), 0) {}

// A prefix cached by one prefill mostly sits in consecutive page ids, so the page after the
// previous hit is tried first: cached under the same hash means the index maps that hash
// to it, the same answer as a find, from records read in order instead of a random index
// bucket per page. Otherwise the index answers; while it did within the last 16 pages, its
// buckets are requested ahead (probe-ahead). A prefix in one long run skips all that.
std::uint64_t PrefixLookup::probe_in_order(const Request& q, GroupId g, std::uint64_t pages) {
  std::vector<PageId>& memo = memo_[g];
  if (memo.size() < pages) memo.resize(pages);  // grows once per longest prompt
  const Group& grp = groups_[g];
  const BlockHash* hv = page_keys(q, grp, g).data();
  const PageRec* rec = grp.pg.data();
  const std::uint64_t num_pages = grp.pg.size();
  PageId* out = memo.data();
  std::uint64_t next = num_pages;  // candidate: the page after the previous hit
  const Cached in_group{&grp};
  std::uint64_t i = 0, last_index = 0;
  for (; i < pages; ++i) {
    if (i < last_index + kIndexAhead) prefetch_probe(index_, g, hv, i, pages, true);
    PageId page;
    if (next < num_pages && rec[next].hashed && rec[next].hash == hv[i]) {
      page = static_cast<PageId>(next);
    } else {
      last_index = i;
      page = index_.find(g, hv[i], in_group);
      if (page == kNullPage) break;
    }
    out[i] = page;
    next = std::uint64_t{page} + 1;
  }
  return i;
}

// Group g's longest valid prefix of at most p tokens.
std::uint64_t PrefixLookup::decoder_hit(const Request& q, GroupId g, std::uint64_t p) {
  const Group& grp = groups_[g];
  const std::span<const BlockHash> chain = page_keys(q, grp, g);
  if (first_miss_[g] == kNoProbe) {
    IndexProbe probe(index_, g, chain, memo_[g], grp);
    return grp.policy->longest_valid_prefix(p, probe);
  }
  const std::uint64_t v = std::min(p / grp.P, first_miss_[g]) * grp.P;
  if constexpr (kCheckInternal) {  // the in-order probe against the policy's own rule
    std::vector<PageId> memo(p / grp.P, kUnknown);
    IndexProbe probe(index_, g, chain, memo, grp);
    if (const std::uint64_t w = grp.policy->longest_valid_prefix(p, probe); w != v)
      fail("debug check: group {} in-order probe finds {} tokens, longest_valid_prefix {}", g, v, w);
  }
  return v;
}

// An encoder-token group: the hit stops before the first image it needs and lacks.
std::uint64_t PrefixLookup::image_hit(const Request& q, GroupId g, std::uint64_t p) const {
  const Group& grp = groups_[g];
  const Cached in_group{&grp};
  std::uint64_t v = p;
  const std::span<const MultimodalItem> items = q.ids.items();
  for (std::uint32_t k = 0; k < items.size(); ++k) {
    const MultimodalItem& m = items[k];
    if (!grp.image.needs(m.offset, m.length, v)) continue;
    const std::uint64_t pages = q.images.page[g][k + 1] - q.images.page[g][k];
    for (std::uint64_t j = 0; j < pages; ++j) {
      if (index_.find(g, q.ids.item_page_hash(k, j), in_group) == kNullPage) {
        v = m.offset;
        break;
      }
    }
  }
  return v;
}

std::uint64_t PrefixLookup::longest_hit(RequestId handle, const Request& q, std::uint64_t limit) {
  memo_owner_ = handle;
  memo_uncached_ = store_.uncached();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    first_miss_[g] = kNoProbe;
    const Group& grp = groups_[g];
    if (!grp.decoder) continue;
    accepted_[g] = ~std::uint64_t{0};
    if (grp.whole_prefix)  // a successor-keyed group: as far as its keys go
      first_miss_[g] = probe_in_order(q, g, std::min<std::uint64_t>(limit / grp.P, page_keys(q, grp, g).size()));
    else
      memo_[g].assign(limit / grp.P, kUnknown);
  }
  // Shrink p until every group accepts it. A group whose last answer equals p is not
  // asked again.
  std::uint64_t p = limit;
  for (bool changed = true; changed && p > 0;) {
    changed = false;
    for (GroupId g = 0; g < groups_.size() && p > 0; ++g) {
      std::uint64_t v = p;
      if (groups_[g].decoder) {
        if (accepted_[g] == p || groups_[g].draft) continue;  // a draft never shortens the hit
        v = accepted_[g] = decoder_hit(q, g, p);
      } else {
        v = image_hit(q, g, p);
      }
      if (v < p) {
        p = v;
        changed = true;
      }
    }
  }
  // Each draft group's own hit inside p (draft_hit()).
  for (GroupId g = 0; g < groups_.size(); ++g)
    if (groups_[g].draft) draft_hit_[g] = p > 0 ? decoder_hit(q, g, p) : 0;
  return p;
}

std::uint64_t PrefixLookup::whole_prefix_hit(std::uint64_t limit) const {
  std::uint64_t v = limit;
  for (GroupId g = 0; g < groups_.size(); ++g)
    if (groups_[g].decoder && groups_[g].whole_prefix && !groups_[g].draft && first_miss_[g] != kNoProbe)
      v = std::min(v, first_miss_[g] * groups_[g].P);
  return v;
}

PageId PrefixLookup::page_of(const Request& q, GroupId g, std::uint64_t i) {
  const Group& grp = groups_[g];
  IndexProbe probe(index_, g, page_keys(q, grp, g), memo_[g], grp);
  return probe.page(i);
}

bool PrefixLookup::hit_pages(const Request& q, GroupId g, std::uint64_t p, bool mine, const PageId** out,
                             const BlockHash** check) {
  Group& grp = groups_[g];
  const std::uint64_t pages = p / grp.P;
  const std::uint64_t lo = std::min(grp.policy->first_required_page(p), pages);
  const BlockHash* hv = page_keys(q, grp, g).data();
  const PageId* hit;
  if (mine && grp.whole_prefix) {
    if (pages > first_miss_[g]) return false;  // cannot be: the lookup accepted p
    hit = memo_[g].data();
  } else {
    // Pages the memo knows (another group's lookup since: none), else the index.
    if (!mine) memo_[g].assign(pages, kUnknown);
    run_.resize(pages);
    for (std::uint64_t i = lo; i < pages; ++i) {
      run_[i] = page_of(q, g, i);
      if (run_[i] == kNullPage) return false;
    }
    hit = run_.data();
  }
  // The memo's pages need no hash check when no page left the cache since the lookup
  // (debug tier 2 checks them all the same).
  const bool unchanged = mine && store_.uncached() == memo_uncached_;
  if constexpr (kCheckInternal) {
    for (std::uint64_t i = lo; unchanged && i < pages; ++i)
      if (!store_.rec(g, hit[i]).hashed || !(store_.rec(g, hit[i]).hash == hv[i]))
        fail("debug check: group {} page {} of a hit left the cache with no eviction counted", g, i);
  }
  *check = unchanged ? nullptr : hv;
  *out = hit;
  return true;
}

PageId PrefixLookup::image_page(GroupId g, const BlockHash& h) const { return index_.find(g, h, Cached{&groups_[g]}); }

// A page serves the combined hit when cached here or held by the tier. A whole-prefix
// group: its first page neither cached (in order up to longest_hit's first miss, then the
// index) nor in the tier ends it; other groups ask their policy over the memoized probe.
std::uint64_t PrefixLookup::tier_group_hit(const Request& q, GroupId g, std::uint64_t p, const TierPresence& tier) {
  const Group& grp = groups_[g];
  if (grp.whole_prefix && first_miss_[g] != kNoProbe) {
    const std::uint64_t pages = p / grp.P;
    std::uint64_t i = 0;
    while (i < pages && (i < first_miss_[g] || tier.has(g, i) || cached(q, g, i) != kNullPage)) ++i;
    return i * grp.P;
  }
  class Combined final : public PageProbe {
   public:
    Combined(IndexProbe& local, const TierPresence& t, GroupId group) : local_(local), tier_(t), g_(group) {}
    bool hit(std::uint64_t i) override { return tier_.has(g_, i) || local_.hit(i); }

   private:
    IndexProbe& local_;
    const TierPresence& tier_;
    GroupId g_;
  };
  IndexProbe local(index_, g, page_keys(q, grp, g), memo_[g], grp);
  Combined probe(local, tier, g);
  return grp.policy->longest_valid_prefix(p, probe);
}

std::uint64_t PrefixLookup::longest_hit_with(const Request& q, std::uint64_t limit, const TierPresence& tier) {
  std::uint64_t p = limit;
  for (bool changed = true; changed && p > 0;) {
    changed = false;
    for (GroupId g = 0; g < groups_.size() && p > 0; ++g) {
      if (groups_[g].draft) continue;  // a draft never shortens the hit (its tier keys are not listed)
      const std::uint64_t v = groups_[g].decoder ? tier_group_hit(q, g, p, tier) : image_hit(q, g, p);
      if (v < p) {
        p = v;
        changed = true;
      }
    }
  }
  return p;
}

PageId PrefixLookup::cached(const Request& q, GroupId g, std::uint64_t i) const {
  const Group& grp = groups_[g];
  const std::span<const BlockHash> chain = page_keys(q, grp, g);
  if (i >= chain.size()) return kNullPage;
  return index_.find(g, chain[i], Cached{&grp});
}

bool PrefixLookup::evictable_in_hit(RequestId handle, const Request& q, std::uint64_t p,
                                    std::vector<std::uint64_t>& out) {
  if (memo_owner_ != handle || store_.uncached() != memo_uncached_) return false;
  out.assign(groups_.size(), 0);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    if (!grp.decoder) continue;
    const std::uint64_t gp = group_hit(q, g, p);
    const std::uint64_t pages = gp / grp.P;
    for (std::uint64_t i = std::min(grp.policy->first_required_page(gp), pages); i < pages; ++i) {
      const PageId page = grp.whole_prefix ? memo_[g][i] : page_of(q, g, i);
      if (page == kNullPage) return false;
      out[g] += store_.rec(g, page).ref == 0;
    }
  }
  return true;
}

bool PrefixLookup::image_cached(const MultimodalItem& m, std::uint32_t lora, const BlockHasher& hasher) const {
  bool any = false;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    if (grp.decoder) continue;
    any = true;
    const Cached in_group{&grp};
    const std::uint64_t pages = (m.length + grp.P - 1) / grp.P;
    for (std::uint64_t j = 0; j < pages; ++j)
      if (index_.find(g, hasher.hash_item_page(m.hash, static_cast<std::uint32_t>(j), lora), in_group) == kNullPage)
        return false;
  }
  return any;
}

void PrefixLookup::count_hit(const Request& q, std::uint64_t p) {
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (grp.decoder) {
      const std::uint64_t gp = group_hit(q, g, p);
      const std::uint64_t pages = gp / grp.P;
      grp.hit_pages += pages - std::min(grp.policy->first_required_page(gp), pages);
      continue;
    }
    const std::span<const MultimodalItem> items = q.ids.items();
    for (std::uint32_t k = 0; k < items.size(); ++k)
      if (grp.image.needs(items[k].offset, items[k].length, p))
        grp.hit_pages += q.images.page[g][k + 1] - q.images.page[g][k];
  }
}

}  // namespace kvmm::detail
