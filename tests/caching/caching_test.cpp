// Block hashes, layer policies (Jenga §5.2 valid-prefix example), the LRU evictor and
// the prefix index.
#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/evictor.hpp"
#include "kvmm/caching/layer_policy.hpp"
#include "kvmm/caching/prefix_index.hpp"
#include "kvmm/error.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

using namespace kvmm;

namespace {

class VectorProbe final : public PageProbe {
 public:
  explicit VectorProbe(std::vector<bool> hits) : hits_(std::move(hits)) {}
  bool hit(std::uint64_t i) override {
    ++probes;
    return i < hits_.size() && hits_[i];
  }
  std::uint64_t probes = 0;

 private:
  std::vector<bool> hits_;
};

std::set<std::uint64_t> valid_set(const LayerPolicy& policy, const std::vector<bool>& hits) {
  std::set<std::uint64_t> out;
  for (std::uint64_t p = 1; p <= hits.size() * policy.tokens_per_page(); ++p) {
    VectorProbe probe(hits);
    if (policy.longest_valid_prefix(p, probe) == p) out.insert(p);
  }
  return out;
}

}  // namespace

TEST_CASE("block hashes chain parent, tokens and extra keys", "[caching][hash]") {
  const std::vector<std::uint32_t> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  const BlockHash h0 = hash_page({}, a, {});
  CHECK(h0 == hash_page({}, a, {}));
  CHECK_FALSE(h0 == hash_page({}, b, {}));
  CHECK_FALSE(h0 == hash_page(h0, a, {}));  // parent matters
  PageExtraKeys lora;
  lora.lora_id = 7;
  CHECK_FALSE(h0 == hash_page({}, a, lora));
  PageExtraKeys salted;
  salted.salt = "tenant-1";
  CHECK_FALSE(h0 == hash_page({}, a, salted));
  salted.salt = "tenant-2";
  CHECK_FALSE(hash_page({}, a, salted) == hash_page({}, a, PageExtraKeys{0, nullptr, 0, "tenant-1"}));
  MultimodalItem img{hash_bytes(std::as_bytes(std::span(a))), 0, 8};
  PageExtraKeys mm;
  mm.item = &img;
  mm.item_offset = 0;
  const BlockHash with_img = hash_page({}, a, mm);
  CHECK_FALSE(h0 == with_img);
  mm.item_offset = 4;
  CHECK_FALSE(with_img == hash_page({}, a, mm));  // offset inside the image matters
  // Long pages (Mamba checkpoints) take the streaming path and stay deterministic.
  std::vector<std::uint32_t> long_page(4096, 9);
  CHECK(hash_page(h0, long_page, {}) == hash_page(h0, long_page, {}));
  long_page[4095] = 8;
  CHECK_FALSE(hash_page(h0, long_page, {}) == hash_page(h0, std::vector<std::uint32_t>(4096, 9), {}));
  CHECK_FALSE(hash_item_page(img.hash, 0, 0) == hash_item_page(img.hash, 1, 0));
}

// Jenga §5.2 / the slides: request [A B C D E F G H I J], sliding window 4. Full
// attention has A..I cached (J missing), the sliding window layer misses E. The paper
// lists the sliding-window prefixes {4, 9, 10}; prefixes shorter than the window with
// every token cached (1, 2, 3) are valid too here (their queries read nothing older).
TEST_CASE("valid prefixes of full attention and sliding window (Jenga §5.2)", "[caching][policy]") {
  FullAttentionPolicy full(1);
  SlidingWindowPolicy sw(1, 4);
  const std::vector<bool> full_hits{1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
  const std::vector<bool> sw_hits{1, 1, 1, 1, 0, 1, 1, 1, 1, 1};
  CHECK(valid_set(full, full_hits) == std::set<std::uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  const std::set<std::uint64_t> sw_valid = valid_set(sw, sw_hits);
  CHECK(sw_valid == std::set<std::uint64_t>{1, 2, 3, 4, 9, 10});
  // The longest common valid prefix is ABCDEFGHI; the common ones are {1..4, 9}.
  std::set<std::uint64_t> common;
  for (auto p : sw_valid)
    if (valid_set(full, full_hits).count(p)) common.insert(p);
  CHECK(common == std::set<std::uint64_t>{1, 2, 3, 4, 9});
  VectorProbe pf(full_hits), ps(sw_hits);
  CHECK(full.longest_valid_prefix(10, pf) == 9);
  CHECK(sw.longest_valid_prefix(9, ps) == 9);
}

TEST_CASE("sliding window hit probes O(window / page) pages per candidate", "[caching][policy]") {
  const std::uint32_t P = 16, w = 4096;
  SlidingWindowPolicy sw(P, w);
  const std::uint64_t pages = 8192;  // a 128k-token prompt
  std::vector<bool> hits(pages, true);
  VectorProbe all(hits);
  CHECK(sw.longest_valid_prefix(pages * P, all) == pages * P);
  CHECK(all.probes == w / P);
  // A miss inside the last window moves the candidate below it: at most one more window.
  hits[pages - 10] = false;
  VectorProbe one(hits);
  CHECK(sw.longest_valid_prefix(pages * P, one) == (pages - 10) * P);
  CHECK(one.probes <= 10 + w / P);
}

TEST_CASE("sliding window: few cached pages cost one probe per window", "[caching][policy]") {
  const std::uint32_t P = 16, w = 4096;
  SlidingWindowPolicy sw(P, w);
  const std::uint64_t pages = 8192;
  VectorProbe none(std::vector<bool>(pages, false));
  CHECK(sw.longest_valid_prefix(pages * P, none) == 0);
  CHECK(none.probes <= pages / (w / P) + 1);
  // Every tenth page cached: still no window of 256 consecutive pages.
  std::vector<bool> sparse(pages, false);
  for (std::uint64_t i = 5; i < pages; i += 10) sparse[i] = true;
  VectorProbe sp(sparse);
  CHECK(sw.longest_valid_prefix(pages * P, sp) == 0);
  CHECK(sp.probes <= 2 * (pages / (w / P) + 1));
}

TEST_CASE("suffix policies agree with brute force on random hit patterns", "[caching][policy]") {
  // The longest p <= limit, a multiple of P, whose required pages all hit, by trying every
  // candidate; and each page probed at most once.
  std::mt19937_64 rng(5);
  class CountingProbe final : public PageProbe {
   public:
    explicit CountingProbe(const std::vector<bool>& hits) : hits_(hits), seen_(hits.size(), 0) {}
    bool hit(std::uint64_t i) override {
      REQUIRE(i < hits_.size());
      REQUIRE(seen_[i]++ == 0);
      return hits_[i];
    }

   private:
    const std::vector<bool>& hits_;
    std::vector<int> seen_;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    const std::uint32_t P = 1 + static_cast<std::uint32_t>(rng() % 4);
    const std::uint64_t pages = 1 + rng() % 40;
    std::vector<bool> hits(pages);
    const std::uint64_t density = rng() % 11;  // tenths
    for (std::uint64_t i = 0; i < pages; ++i) hits[i] = rng() % 10 < density;
    const std::uint64_t limit = rng() % (pages * P + 1);
    std::unique_ptr<LayerPolicy> policy;
    if (rng() % 2)
      policy = std::make_unique<SlidingWindowPolicy>(P, 1 + static_cast<std::uint32_t>(rng() % (4 * P * 4)));
    else
      policy = std::make_unique<ChunkedLocalPolicy>(P, 1 + static_cast<std::uint32_t>(rng() % (4 * P * 4)));
    std::uint64_t want = 0;
    for (std::uint64_t b = limit / P; b > 0 && want == 0; --b) {
      bool ok = true;
      for (std::uint64_t i = policy->first_required_page(b * P); i < b; ++i) ok = ok && hits[i];
      if (ok) want = b * P;
    }
    CountingProbe probe(hits);
    INFO(policy->name() << " P " << P << " pages " << pages << " limit " << limit << " trial " << trial);
    REQUIRE(policy->longest_valid_prefix(limit, probe) == want);
  }
}

TEST_CASE("chunked local and Mamba policies", "[caching][policy]") {
  ChunkedLocalPolicy chunked(4, 8);  // two pages per chunk
  CHECK(chunked.first_needed_page(9) == 2);
  CHECK(chunked.first_touched_page(9, 12) == 2);
  CHECK(chunked.first_required_page(12) == 2);
  CHECK(chunked.first_required_page(16) == 4);  // a chunk boundary needs nothing
  VectorProbe c1({true, true, false, true, true, true});
  CHECK(chunked.longest_valid_prefix(24, c1) == 24);  // chunk [16, 24) is cached
  VectorProbe c2({true, true, true, true, false, true});
  CHECK(chunked.longest_valid_prefix(23, c2) == 16);  // page 4 missing: back to the chunk start
  VectorProbe c3({false, false, false, false, true, false});
  CHECK(chunked.longest_valid_prefix(23, c3) == 20);  // only the current chunk matters

  MambaPolicy mamba(512);
  VectorProbe m({true, false, true, false});  // checkpoints at 512 and 1536
  CHECK(mamba.longest_valid_prefix(2047, m) == 1536);
  CHECK(m.probes == 1);  // only the last checkpoint of the candidate is examined
  VectorProbe m2({true, false, false, false});
  CHECK(mamba.longest_valid_prefix(2048, m2) == 512);
  CHECK(mamba.first_required_page(1536) == 2);
  CHECK(mamba.first_needed_page(1537) == 3);
  CHECK(mamba.first_needed_page(1536) == 2);
  CHECK(mamba.first_touched_page(1536, 1600) == 2);
}

TEST_CASE("make_policy maps layer kinds and rejects encoder groups", "[caching][policy]") {
  CHECK(make_policy(LayerGroup::sliding_window("sw", 1, 1, 8, 2, 16, 64))->name() == "sliding_window");
  CHECK(make_policy(LayerGroup::mamba_state("m", 1, 1024, 256))->tokens_per_page() == 256);
  CHECK_THROWS_WITH(make_policy(LayerGroup::cross_attention("x", 1, 1, 8, 2, 16)), Catch::Contains("group = x"));
  CHECK_THROWS_WITH(SlidingWindowPolicy(16, 0), Catch::Contains("window = 0"));
}

TEST_CASE("LRU evictor orders by priority, time, then longer prefix first", "[caching][evictor]") {
  LruEvictor lru(16);
  lru.insert(3, {5, 10}, 0);
  lru.insert(4, {5, 30}, 0);  // same step, longer prefix: before 3
  lru.insert(5, {2, 1}, 0);   // older step: first
  lru.insert(6, {1, 1}, 1);   // priority 1: after all of priority 0
  lru.insert(7, {5, 10}, 0);  // tie with 3: after it (FIFO)
  std::vector<PageId> order;
  for (PageId p = lru.front(); p != kNullPage; p = lru.after(p)) order.push_back(p);
  CHECK(order == std::vector<PageId>{5, 4, 3, 7, 6});
  lru.erase(4);
  CHECK(lru.front() == 5);
  lru.erase(5);
  CHECK(lru.front() == 3);
  CHECK(lru.size() == 3);
  CHECK_THROWS_WITH(lru.insert(3, {0, 0}, 0), Catch::Contains("page id = 3"));
  CHECK_THROWS_WITH(lru.erase(4), Catch::Contains("page id = 4"));
  CHECK(lru.size() == 3);
}

TEST_CASE("LRU evictor matches a sorted reference under random operations", "[caching][evictor]") {
  std::mt19937_64 rng(7);
  const std::uint32_t N = 64;
  LruEvictor lru(N);
  std::map<PageId, std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, std::uint64_t>>
      ref;  // level, time, -len, seq
  std::uint64_t seq = 0, now = 0;
  for (int op = 0; op < 40000; ++op) {
    const PageId p = static_cast<PageId>(rng() % N);
    if (rng() % 8 == 0) ++now;
    if (op % 5000 == 0) {  // a batch of requests released in one step, each last page first
      for (PageId x = 0; x < N; ++x)
        if (lru.contains(x)) {
          lru.erase(x);
          ref.erase(x);
        }
      for (PageId r = 0; r < 8; ++r)
        for (PageId i = 8; i-- > 0;) {
          lru.insert(r * 8 + i, {now, i + 1}, 0);
          ref[r * 8 + i] = {0, now, ~std::uint64_t{i + 1}, seq++};
        }
    }
    if (!lru.contains(p)) {
      const std::uint64_t t = now - std::min<std::uint64_t>(now, rng() % 3);
      const std::uint64_t len = rng() % 10;
      const auto level = static_cast<std::uint32_t>(rng() % 2);
      lru.insert(p, {t, len}, level);
      ref[p] = {level, t, ~len, seq++};
    } else if (rng() % 2) {
      lru.erase(p);
      ref.erase(p);
    }
    REQUIRE(lru.size() == ref.size());
    if (op % 64 == 0) {  // the whole order, not just the front
      std::vector<std::pair<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, std::uint64_t>, PageId>> want;
      for (const auto& [id, k] : ref) want.emplace_back(k, id);
      std::sort(want.begin(), want.end());
      std::vector<PageId> got;
      for (PageId x = lru.front(); x != kNullPage; x = lru.after(x)) got.push_back(x);
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == want[i].second);
    }
    if (!ref.empty()) {
      auto best =
          std::min_element(ref.begin(), ref.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
      REQUIRE(lru.front() == best->first);
    }
  }
}

TEST_CASE("LRU evictor keeps long runs of equal keys in order", "[caching][evictor]") {
  // Three keys and two levels only: runs of tens of pages form, grow at their tail, lose
  // heads, tails and middles, and are skipped whole by inserts that walk from the tail or
  // from the previous insert. The whole order is checked against a sorted reference after
  // every operation.
  std::mt19937_64 rng(11);
  const std::uint32_t N = 96;
  LruEvictor lru(N);
  std::map<PageId, std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, std::uint64_t>> ref;
  std::uint64_t seq = 0;
  for (int op = 0; op < 20000; ++op) {
    const PageId p = static_cast<PageId>(rng() % N);
    if (!lru.contains(p)) {
      const std::uint64_t t = rng() % 2, len = rng() % 2;
      const auto level = static_cast<std::uint32_t>(rng() % 4 == 0);
      lru.insert(p, {t, len}, level);
      ref[p] = {level, t, ~len, seq++};
    } else if (rng() % 3 == 0) {
      lru.erase(p);
      ref.erase(p);
    }
    std::vector<std::pair<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, std::uint64_t>, PageId>> want;
    for (const auto& [id, k] : ref) want.emplace_back(k, id);
    std::sort(want.begin(), want.end());
    std::vector<PageId> got;
    for (PageId x = lru.front(); x != kNullPage; x = lru.after(x)) got.push_back(x);
    REQUIRE(got.size() == want.size());
    REQUIRE(lru.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == want[i].second);
  }
}

TEST_CASE("prefix index insert, find, erase with collisions", "[caching][index]") {
  // The caller keeps each page's hash (as the manager's page records do); the index keeps
  // fingerprints only and confirms them against hash_of. Few distinct hi values force long
  // probe runs, equal fingerprints and backward shifts; two groups share the table.
  const std::uint32_t kPages = 300;
  PrefixIndex index(200, 2);
  std::mt19937_64 rng(3);
  std::map<std::pair<GroupId, std::pair<std::uint64_t, std::uint64_t>>, PageId> ref;
  std::vector<BlockHash> page_hash[2] = {std::vector<BlockHash>(kPages), std::vector<BlockHash>(kPages)};
  std::vector<bool> used[2] = {std::vector<bool>(kPages), std::vector<bool>(kPages)};
  auto hash_of = [&](GroupId g, PageId p) -> const BlockHash& {
    REQUIRE(g < 2);
    REQUIRE(used[g][p]);  // only indexed pages are asked for
    return page_hash[g][p];
  };
  for (int op = 0; op < 50000; ++op) {
    const GroupId g = static_cast<GroupId>(rng() % 2);
    const BlockHash h{rng() % 300, (rng() % 300) * 0x100000001ULL};
    const auto key = std::make_pair(g, std::make_pair(h.lo, h.hi));
    const auto it = ref.find(key);
    if (it == ref.end() && ref.size() < 200) {
      PageId p = static_cast<PageId>(rng() % kPages);
      while (used[g][p]) p = (p + 1) % kPages;
      REQUIRE(index.find(g, h, hash_of) == kNullPage);
      used[g][p] = true;
      page_hash[g][p] = h;
      REQUIRE(index.insert(g, h, p, hash_of));
      ref[key] = p;
    } else if (it != ref.end()) {
      const PageId p = it->second;
      REQUIRE(index.find(g, h, hash_of) == p);
      REQUIRE(index.find(1 - g, h, hash_of) == (ref.count({1 - g, key.second}) ? ref[{1 - g, key.second}] : kNullPage));
      REQUIRE_FALSE(index.insert(g, h, p, hash_of));  // present: nothing changes
      if (rng() % 2) {
        PageId other = (p + 1) % kPages;
        while (used[g][other]) other = (other + 1) % kPages;
        REQUIRE_FALSE(index.erase(g, h, other));  // a page not indexed: nothing changes
        REQUIRE(index.erase(g, h, p));
        used[g][p] = false;
        ref.erase(it);
        REQUIRE(index.find(g, h, hash_of) == kNullPage);
        REQUIRE_FALSE(index.erase(g, h, p));
      }
    }
    REQUIRE(index.size() == ref.size());
  }
  for (const auto& [k, p] : ref) REQUIRE(index.find(k.first, BlockHash{k.second.first, k.second.second}, hash_of) == p);
  // Full: the 201st entry is refused with an error naming the capacity, nothing changes.
  while (ref.size() < 200) {
    const BlockHash h{rng(), rng()};
    PageId p = 0;
    while (used[0][p]) ++p;
    used[0][p] = true;
    page_hash[0][p] = h;
    REQUIRE(index.insert(0, h, p, hash_of));
    ref[{0, {h.lo, h.hi}}] = p;
  }
  PageId spare = 0;
  while (used[1][spare]) ++spare;
  used[1][spare] = true;
  page_hash[1][spare] = BlockHash{1, 2};
  CHECK_THROWS_WITH(index.insert(1, BlockHash{1, 2}, spare, hash_of), Catch::Contains("full with 200"));
  CHECK(index.size() == 200);
  CHECK_THROWS_WITH(index.insert(2, BlockHash{1, 2}, spare, hash_of), Catch::Contains("group = 2"));
  CHECK_THROWS_WITH(PrefixIndex(10, 0), Catch::Contains("num_groups = 0"));
}
