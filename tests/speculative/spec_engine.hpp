// A simulated speculative-decoding engine over a KVCacheManager (tests/speculative): it
// writes into every page slot a value that is a function of the exact tokens the slot's
// KV (or state) was computed from, drafts included, so a page or checkpoint a hit returns
// can be checked against the request's true tokens: one computed from a rejected draft or
// another branch fails. Groups: 0 target full attention, 1 recurrent state (checkpoints),
// 2 draft (successor_tokens s). Merged (an EAGLE head's layers sharing the target's pages,
// vLLM's usual plan): the target group is keyed with the s successors too and its page holds,
// after the target's P slots, P draft-layer slots written as the draft's. Speculation: draft lengths and acceptance are
// drawn by the caller; rejected drafts leave their values in the pages past the verified tokens.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace kvmm::spec_test {

inline constexpr GroupId kTarget = 0, kState = 1, kDraft = 2;
inline constexpr std::uint64_t kGarbage = 0xbadbadbadULL;

inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// h[n]: a hash of tokens [0, n).
inline std::vector<std::uint64_t> prefix_hashes(const std::vector<std::uint32_t>& t) {
  std::vector<std::uint64_t> h(t.size() + 1, 0x1234);
  for (std::size_t i = 0; i < t.size(); ++i) h[i + 1] = mix(h[i], t[i]);
  return h;
}

// The layout: target P = 4, state checkpoints every 8 tokens, a draft of `draft_P` tokens a
// page (full attention, or a sliding window when window > 0).
inline KVLayout spec_layout(std::uint32_t successors, bool tagged, std::uint32_t draft_window = 0,
                            std::uint32_t evict_sooner = 0, std::uint32_t draft_P = 4, bool merged = false) {
  LayerGroup target = LayerGroup::full_attention("target", 1, 1, 8, 2, 4);
  if (merged) target.successor_tokens = successors;
  LayerGroup state = LayerGroup::mamba_state("state", 1, 256, 8);
  state.tagged_checkpoints = tagged;
  LayerGroup draft = draft_window > 0 ? LayerGroup::sliding_window("draft", 1, 1, 8, 2, draft_P, draft_window)
                                      : LayerGroup::full_attention("draft", 1, 1, 8, 2, draft_P);
  draft.draft = DraftRole{.target = "target", .successor_tokens = successors, .evict_sooner_steps = evict_sooner};
  return KVLayout::plan({target, state, draft});
}

struct EngineRequest {
  RequestId id = kNoRequest;
  std::vector<std::uint32_t> toks;  // verified tokens known to the manager
  std::uint64_t salt = 0;           // the target's sampling: true_next depends on it
  std::uint64_t computed = 0;
  std::uint64_t draft_done = 0;  // draft positions written from true tokens
  std::uint64_t max_len = 0;
  double accept = 0.5;
};

class SpecEngine {
 public:
  SpecEngine(KVCacheManager& kv, std::uint32_t successors, bool tagged, bool merged = false)
      : kv_(kv), s_(successors), tagged_(tagged), merged_(merged) {
    for (GroupId g = 0; g < 3; ++g) P_[g] = kv_.layout().group(g).tokens_per_page;
  }

  // The target's token after t (deterministic in the tokens and the request's salt).
  static std::uint32_t true_next(const std::vector<std::uint32_t>& t, std::uint64_t salt) {
    return static_cast<std::uint32_t>(mix(prefix_hashes(t).back(), salt) % 50);
  }
  // Slot values: target KV at j, draft KV at j (from tokens [0, j + s]), state after n.
  std::uint64_t target_value(const std::vector<std::uint64_t>& h, std::uint64_t j) const { return mix(h[j + 1], 1); }
  std::uint64_t draft_value(const std::vector<std::uint64_t>& h, std::uint64_t j) const {
    return j + 1 + s_ < h.size() ? mix(h[j + 1 + s_], 2) : kGarbage;
  }
  static std::uint64_t state_value(const std::vector<std::uint64_t>& h, std::uint64_t n) { return mix(h[n], 3 + n); }

  void begin_step() {
    kv_.begin_step();
    copies_seen_ = 0;
  }
  // Copy-on-write copies the manager planned since the last call: run them.
  void run_copies() {
    const auto copies = kv_.copies();
    for (; copies_seen_ < copies.size(); ++copies_seen_) {
      const PageCopy& c = copies[copies_seen_];
      dev_[c.group][c.dst] = dev_[c.group][c.src];
    }
  }
  void swap_out_plan(std::span<const PageCopy> plan) {
    for (const PageCopy& c : plan) host_[c.group][c.dst] = dev_[c.group][c.src];
  }
  void swap_in_plan(std::span<const PageCopy> plan) {
    for (const PageCopy& c : plan) dev_[c.group][c.dst] = host_[c.group][c.src];
  }

  // After the allocate that admitted q with a hit of p tokens: every page of the hit holds
  // what q's own tokens give (the invariant under test); then the draft positions the
  // manager reports missing are recomputed. Returns the draft's recompute range.
  TokenRange check_hit(EngineRequest& q, std::uint64_t p) {
    const std::vector<std::uint64_t> h = prefix_hashes(q.toks);
    const std::span<const PageId> tp = kv_.page_table(q.id, kTarget);
    for (std::uint64_t j = 0; j < p; ++j) {
      INFO("target position " << j << " of a " << p << "-token hit");
      expect(slot(kTarget, tp[j / P_[kTarget]], j % P_[kTarget]) == target_value(h, j));
      // Merged draft layers take part in the hit: every position holds its own successors'.
      if (merged_) expect(slot(kTarget, tp[j / P_[kTarget]], P_[kTarget] + j % P_[kTarget]) == draft_value(h, j));
    }
    if (p >= P_[kState]) {
      const std::span<const PageId> sp = kv_.page_table(q.id, kState);
      INFO("state checkpoint of a " << p << "-token hit");
      expect(slot(kState, sp[p / P_[kState] - 1], 0) == p);
      expect(slot(kState, sp[p / P_[kState] - 1], 1) == state_value(h, p));
    }
    const TokenRange re = kv_.draft_recompute(q.id, kDraft);
    REQUIRE(re.end == p);
    REQUIRE(re.begin <= p);
    REQUIRE(re.begin % P_[kDraft] == 0);
    const std::span<const PageId> dp = kv_.page_table(q.id, kDraft);
    for (std::uint64_t j = 0; j < re.begin; ++j) {
      const PageId page = dp[j / P_[kDraft]];
      if (page == kNullPage) continue;  // a sliding-window draft needs its window only
      INFO("draft position " << j << " of a " << p << "-token hit, draft hit " << re.begin);
      expect(slot(kDraft, page, j % P_[kDraft]) == draft_value(h, j));
    }
    // Recomputed: the draft positions of the hit whose successors are known (a cached draft
    // page had them: re.begin <= known).
    const std::uint64_t known = q.toks.size() > s_ ? std::min<std::uint64_t>(p, q.toks.size() - s_) : 0;
    REQUIRE(re.begin <= std::max<std::uint64_t>(known, 0));
    for (std::uint64_t j = re.begin; j < known; ++j) write(kDraft, dp, j, draft_value(h, j));
    q.computed = p;
    q.draft_done = known;
    hit_tokens_ += p;
    draft_recomputed_ += p - re.begin;
    return re;
  }

  // One step of q after its allocate of `n` known tokens (prefill) or of 1 + drafts
  // (decode: n = 1, k drafts as lookahead): the kernels write every slot from the tokens
  // they see (drafts included), the target verifies, the verified tokens are appended and
  // committed, the draft's positions are rewritten from true tokens, and each state the
  // step wrote is tagged with its exact token count. Returns the tokens committed.
  // `forced`: the drafts to propose (exact tests), else drawn with q.accept.
  std::uint64_t run_step(EngineRequest& q, std::uint32_t n, std::uint32_t k, std::mt19937_64& rng,
                         const std::vector<std::uint32_t>& forced = {}) {
    run_copies();
    const std::uint64_t c = q.computed;
    std::vector<std::uint32_t> spec = q.toks;
    spec.resize(c + n);  // (n <= known tokens - c)
    std::uniform_real_distribution<double> u(0, 1);
    for (std::uint32_t i = 0; i < k; ++i) {  // drafts: right with probability accept
      const std::uint32_t right = true_next(spec, q.salt);
      if (i < forced.size())
        spec.push_back(forced[i]);
      else
        spec.push_back(u(rng) < q.accept ? right : (right + 1 + static_cast<std::uint32_t>(rng() % 49)) % 50);
    }
    const std::uint64_t end = c + n + k;
    const std::vector<std::uint64_t> h = prefix_hashes(spec);
    const std::span<const PageId> tp = kv_.page_table(q.id, kTarget);
    const std::span<const PageId> dp = kv_.page_table(q.id, kDraft);
    const std::span<const PageId> sp = kv_.page_table(q.id, kState);
    for (std::uint64_t j = c; j < end; ++j) write(kTarget, tp, j, target_value(h, j));
    for (std::uint64_t j = q.draft_done; j < end; ++j) write_drafts(tp, dp, j, draft_value(h, j));
    // The state kernel (as vLLM's aligned mode): the state where the step ends, drafts
    // included, into the page of its last position; a checkpoint when that is a page's end.
    const std::uint64_t C = P_[kState];
    const std::uint64_t wrote[1] = {end};
    for (std::uint64_t b : wrote) {
      const PageId page = sp[(b - 1) / C];
      REQUIRE(page != kNullPage);
      dev_[kState][page] = {b, state_value(h, b)};
    }
    // Verification: the drafts agreeing with the target's tokens, then its own token.
    std::uint64_t accepted = 0;
    std::vector<std::uint32_t> truth(spec.begin(), spec.begin() + static_cast<std::ptrdiff_t>(c + n));
    while (accepted < k && spec[c + n + accepted] == true_next(truth, q.salt))
      truth.push_back(spec[c + n + accepted++]);
    const std::uint64_t verified = c + n + accepted;
    // The scheduler loop of docs/manager.md commits and then appends the sampled token: the
    // manager then cannot key the draft page ending at the verified tokens yet.
    const bool commit_first = commit_first_sometimes_ && rng() % 2 == 0;
    if (verified >= q.toks.size()) {  // past the known tokens: the accepted drafts and one sampled
      kv_.append_tokens(q.id, std::span(truth).subspan(q.toks.size()));
      if (commit_first) kv_.commit(q.id, verified);
      truth.push_back(true_next(truth, q.salt));
      kv_.append_token(q.id, truth.back());
      q.toks = truth;
    } else if (commit_first) {
      kv_.commit(q.id, verified);
    }
    accepted_ += accepted;
    drafted_ += k;
    // The draft pass: positions whose successors are now known, from true tokens.
    const std::vector<std::uint64_t> th = prefix_hashes(q.toks);
    const std::uint64_t known = q.toks.size() > s_ ? std::min<std::uint64_t>(verified, q.toks.size() - s_) : 0;
    for (std::uint64_t j = q.draft_done; j < known; ++j) write_drafts(tp, dp, j, draft_value(th, j));
    q.draft_done = std::max(q.draft_done, known);
    if (!commit_first) kv_.commit(q.id, verified);
    q.computed = verified;
    if (tagged_) {
      for (std::uint64_t b : wrote) {
        const bool cached = kv_.tag_state(q.id, kState, b);
        if (b > verified || b % C != 0) REQUIRE_FALSE(cached);  // a state over a draft is refused
        tagged_cached_ += cached;
      }
    }
    return verified;
  }

  std::uint64_t slot(GroupId g, PageId page, std::uint64_t k) const {
    const auto it = dev_[g].find(page);
    if (it == dev_[g].end() || k >= it->second.size()) return 0;
    return it->second[k];
  }

  std::uint64_t hit_tokens_ = 0, draft_recomputed_ = 0, accepted_ = 0, drafted_ = 0, tagged_cached_ = 0;
  // false: a wrong hit is counted in wrong_hits_ instead of failing the test (the test that
  // shows the checker catching untagged checkpoints).
  bool strict_ = true;
  bool commit_first_sometimes_ = false;  // commit before appending the sampled token (half the steps)
  std::uint64_t wrong_hits_ = 0;

 private:
  void expect(bool ok) {
    if (strict_)
      REQUIRE(ok);
    else
      wrong_hits_ += !ok;
  }
  // Slot `off` + j % P of j's page (off = P: a merged page's draft-layer slots).
  void write(GroupId g, std::span<const PageId> row, std::uint64_t j, std::uint64_t v, std::uint64_t off = 0) {
    const std::uint64_t i = j / P_[g];
    REQUIRE(i < row.size());
    if (row[i] == kNullPage) return;  // a sliding window's released page
    std::vector<std::uint64_t>& s = dev_[g][row[i]];
    s.resize(std::max<std::size_t>(s.size(), off + P_[g]), 0);
    s[off + j % P_[g]] = v;
  }
  // The draft pass at position j: the draft group's slot, and a merged target page's.
  void write_drafts(std::span<const PageId> tp, std::span<const PageId> dp, std::uint64_t j, std::uint64_t v) {
    write(kDraft, dp, j, v);
    if (merged_) write(kTarget, tp, j, v, P_[kTarget]);
  }

  KVCacheManager& kv_;
  std::uint32_t s_;
  bool tagged_;
  bool merged_;
  std::uint32_t P_[3] = {};
  std::map<PageId, std::vector<std::uint64_t>> dev_[3], host_[3];
  std::size_t copies_seen_ = 0;
};

}  // namespace kvmm::spec_test
