// Exact scenarios of issue 33 on the hybrid layout of spec_engine.hpp (target full
// attention P = 4, recurrent state with checkpoints every 8 tokens, an EAGLE draft keyed
// with the next token): vLLM's hybrid corruption (a checkpoint holding a rejected draft),
// vLLM's drop-last-block EAGLE rule against the hit kvmm keeps, a target group keyed with
// the next token (draft layers in the target's pages), a draft that never
// shortens the target's hit, draft pages evicted first, and bad input.
#include "kvmm/error.hpp"
#include "kvmm/manager/kv_events.hpp"
#include "kvmm/manager/tier_admission.hpp"
#include "kvmm/testing/manager_inspector.hpp"
#include "spec_engine.hpp"

#include <string>

using namespace kvmm;
using namespace kvmm::spec_test;

namespace {

struct Bench {
  explicit Bench(bool tagged, std::uint32_t evict_sooner = 0, std::uint32_t large_pages = 64, bool merged = false)
      : kv(spec_layout(1, tagged, 0, evict_sooner, 4, merged), {.num_large_pages = large_pages, .max_requests = 8}),
        eng(kv, 1, tagged, merged) {
    eng.begin_step();
  }
  EngineRequest add(std::vector<std::uint32_t> toks) {
    EngineRequest q;
    q.toks = std::move(toks);
    q.id = kv.add_request(q.toks);
    return q;
  }
  // Lookup, admission with the hit checked, and prefill chunks of at most `chunk` tokens.
  std::uint64_t admit_and_prefill(EngineRequest& q, std::uint32_t chunk,
                                  std::uint64_t limit = KVCacheManager::kMaxTokens) {
    const std::uint64_t p = kv.lookup_prefix(q.id, limit);
    std::uint32_t n = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, q.toks.size() - p));
    REQUIRE(kv.allocate(q.id, n));
    eng.check_hit(q, p);
    while (true) {
      eng.run_step(q, n, 0, rng);
      if (q.computed + 1 == q.toks.size()) break;
      n = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, q.toks.size() - q.computed));
      REQUIRE(kv.allocate(q.id, n));
    }
    return p;
  }
  // One decode step proposing `drafts`.
  void decode(EngineRequest& q, const std::vector<std::uint32_t>& drafts) {
    REQUIRE(kv.allocate(q.id, 1, static_cast<std::uint32_t>(drafts.size())));
    eng.run_step(q, 1, static_cast<std::uint32_t>(drafts.size()), rng, drafts);
  }
  // The k tokens the target produces after q's tokens (all drafts right).
  std::vector<std::uint32_t> right(const EngineRequest& q, std::uint32_t k) const {
    std::vector<std::uint32_t> t = q.toks, out;
    for (std::uint32_t i = 0; i < k; ++i) {
      out.push_back(SpecEngine::true_next(t, q.salt));
      t.push_back(out.back());
    }
    return out;
  }

  KVCacheManager kv;
  SpecEngine eng;
  std::mt19937_64 rng{1};
};

std::vector<std::uint32_t> iota_tokens(std::uint32_t n, std::uint32_t from = 1) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = from + i;
  return t;
}

// vLLM's corruption: a step with drafts ends at checkpoint 8 (its state covers rejected
// draft 7); the verified tokens pass 8 a step later without a step ending there. Plain
// checkpoints (cached once the verified tokens pass them) then serve that state to the
// next request sharing the 8 verified tokens; tagged ones never cache it.
void corruption_case(bool tagged) {
  Bench b(tagged);
  EngineRequest a = b.add(iota_tokens(5));
  b.admit_and_prefill(a, 5);  // computed 5, token 5 sampled
  REQUIRE(a.toks.size() == 6);
  std::vector<std::uint32_t> d = b.right(a, 1);
  d.push_back((b.right(a, 2)[1] + 1) % 50);  // draft 7 wrong
  b.decode(a, d);                            // processes 5, 6, 7: its state covers 8 positions
  REQUIRE(a.computed == 7);                  // 6 accepted, 7 rejected (the target's token 7 sampled)
  b.decode(a, b.right(a, 3));                // processes 7..10, all right: verified 11
  REQUIRE(a.computed == 11);
  const std::vector<std::uint32_t> shared(a.toks.begin(), a.toks.begin() + 9);
  b.kv.free(a.id);

  EngineRequest c = b.add(shared);
  c.toks.push_back(42);
  b.kv.append_token(c.id, 42);
  b.eng.strict_ = false;
  const std::uint64_t p = b.admit_and_prefill(c, 16);
  if (tagged) {
    CHECK(p == 0);  // no checkpoint at 8: it was never tagged with 8 verified tokens
    CHECK(b.eng.wrong_hits_ == 0);
  } else {
    CHECK(p == 8);                  // the checkpoint at 8 was cached by the verified count alone...
    CHECK(b.eng.wrong_hits_ == 1);  // ...and holds the state over the rejected draft
  }
  b.kv.check_invariants();
}

}  // namespace

TEST_CASE("speculative: vLLM's hybrid corruption is reproduced with plain checkpoints and cannot happen tagged",
          "[speculative]") {
  corruption_case(false);
  corruption_case(true);
}

TEST_CASE("speculative: a state over a draft position is refused; an exact verified one is cached", "[speculative]") {
  Bench b(true);
  EngineRequest a = b.add(iota_tokens(7));
  const std::uint64_t hit = b.kv.lookup_prefix(a.id);
  REQUIRE(hit == 0);
  REQUIRE(b.kv.allocate(a.id, 7, 4));  // 7 prompt tokens + up to 4 drafts: pages for 11
  b.kv.commit(a.id, 7);
  b.kv.append_tokens(a.id, std::vector<std::uint32_t>{8, 9});
  CHECK_FALSE(b.kv.tag_state(a.id, kState, 8));  // position 7 is not verified yet
  b.kv.commit(a.id, 8);
  CHECK_FALSE(b.kv.tag_state(a.id, kState, 7));  // not a checkpoint
  CHECK(b.kv.tag_state(a.id, kState, 8));        // exactly the 8 verified tokens
  CHECK(b.kv.tag_state(a.id, kState, 8));        // cached already: still true
  b.kv.check_invariants();
}

// vLLM drops the last block of every hit when EAGLE is on (the draft's KV at a block's last
// position depends on the next block's first token). kvmm keys each draft page with that
// token: the whole hit is kept, and only a draft page whose next token differs is
// recomputed (4 draft positions of a tiny head).
TEST_CASE("speculative: vLLM's drop-last-block EAGLE case keeps kvmm's whole hit", "[speculative]") {
  Bench b(true);
  EngineRequest a = b.add(iota_tokens(16));
  b.admit_and_prefill(a, 8);  // checkpoints 8 and 16 tagged; token 16 sampled
  REQUIRE(a.toks.size() == 17);
  const std::vector<std::uint32_t> doc(a.toks.begin(), a.toks.begin() + 16);
  const std::uint32_t next = a.toks[16];
  b.kv.free(a.id);

  // The same next token: every draft page is reused.
  std::vector<std::uint32_t> t1 = doc;
  t1.insert(t1.end(), {next, 7, 7});
  EngineRequest r1 = b.add(t1);
  CHECK(b.admit_and_prefill(r1, 16) == 16);
  CHECK(b.kv.draft_recompute(r1.id, kDraft) == TokenRange{16, 16});
  // vLLM's rule on the same cache: the hit capped one block below (12), then the state's
  // checkpoint below it (8).
  std::vector<std::uint32_t> t2 = doc;
  t2.insert(t2.end(), {next, 8, 8});
  EngineRequest r2 = b.add(t2);
  CHECK(b.admit_and_prefill(r2, 16, 16 - 4) == 8);
  // Another next token: the target's hit stays 16; the draft recomputes its last page.
  std::vector<std::uint32_t> t3 = doc;
  t3.insert(t3.end(), {(next + 1) % 50, 9, 9});
  EngineRequest r3 = b.add(t3);
  CHECK(b.admit_and_prefill(r3, 16) == 16);
  CHECK(b.kv.draft_recompute(r3.id, kDraft) == TokenRange{12, 16});
  b.kv.check_invariants();
}

// vLLM's usual plan merges the EAGLE head's layers into the target's group: kvmm keys that
// group with the next token (LayerGroup::successor_tokens), as vLLM's lookahead hashes do.
// The last page of a prompt is hit exactly when the next token matches; vLLM's drop rule
// never hits it.
TEST_CASE("speculative: a target group keyed with the next token hits the last page when it matches", "[speculative]") {
  Bench b(true, 0, 64, true);
  EngineRequest a = b.add(iota_tokens(16));
  b.admit_and_prefill(a, 8);  // checkpoints 8 and 16 tagged; token 16 sampled, page 3 cached
  REQUIRE(a.toks.size() == 17);
  const std::vector<std::uint32_t> doc(a.toks.begin(), a.toks.begin() + 16);
  const std::uint32_t next = a.toks[16];
  b.kv.free(a.id);

  // The same prompt and next token: page 3 (tokens 12..15) is hit, content-checked.
  std::vector<std::uint32_t> t1 = doc;
  t1.insert(t1.end(), {next, 7, 7});
  EngineRequest r1 = b.add(t1);
  CHECK(b.admit_and_prefill(r1, 16) == 16);
  CHECK(b.kv.draft_recompute(r1.id, kDraft) == TokenRange{16, 16});
  // Another next token: page 3 was computed for `next`, so the target's hit stops at page
  // 3 (12 tokens), and the state's checkpoint below it gives 8.
  std::vector<std::uint32_t> t2 = doc;
  t2.insert(t2.end(), {(next + 1) % 50, 9, 9});
  EngineRequest r2 = b.add(t2);
  CHECK(b.kv.lookup_prefix(r2.id) == 8);
  b.kv.reset(r2.id);
  CHECK(b.admit_and_prefill(r2, 16) == 8);
  // The prompt alone (its next token not known yet): page 3 is not hit either.
  EngineRequest r3 = b.add(doc);
  CHECK(b.kv.lookup_prefix(r3.id) == 8);
  b.kv.check_invariants();
}

// Miss reasons read a successor-keyed group's own keys: its evicted page is kEvicted.
TEST_CASE("speculative: a successor-keyed target group's evicted page is reported evicted", "[speculative]") {
  LayerGroup merged = LayerGroup::full_attention("merged", 1, 1, 8, 2, 4);
  merged.successor_tokens = 1;
  KVCacheManager kv(KVLayout::plan({merged}), {.num_large_pages = 8, .max_requests = 4, .miss_reasons = 64});
  const auto serve = [&](const std::vector<std::uint32_t>& toks) {
    kv.begin_step();
    const RequestId r = kv.add_request(toks);
    const std::uint64_t p = kv.lookup_prefix(r);
    REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(toks.size() - p)));
    kv.append_token(r, 49);  // the sampled token: the last page is keyed with it
    kv.commit(r, toks.size());
    kv.free(r);
  };
  const std::vector<std::uint32_t> a = iota_tokens(16);
  serve(a);
  kv.begin_step();
  const RequestId b = kv.add_request(a);
  CHECK(kv.lookup_prefix(b) == 12);  // page 3 needs the next token
  kv.free(b);
  serve(iota_tokens(28, 100));  // a's pages evicted
  serve(iota_tokens(28, 200));
  kv.begin_step();
  const RequestId c = kv.add_request(a);
  CHECK(kv.lookup_prefix(c) == 0);
  CHECK(kv.lookup_report(c).reason == MissReason::kEvicted);
  CHECK(kv.lookup_report(c).groups[0].page == 0);
  kv.check_invariants();
}

TEST_CASE("speculative: a draft group with missing pages never shortens the target's hit", "[speculative]") {
  Bench b(true);
  EngineRequest a = b.add(iota_tokens(16));
  REQUIRE(b.kv.lookup_prefix(a.id) == 0);
  REQUIRE(b.kv.allocate(a.id, 16));
  b.kv.commit(a.id, 16);  // the next token is not known: the draft's page 3 is not cacheable
  CHECK(b.kv.tag_state(a.id, kState, 16));
  b.kv.free(a.id);
  std::vector<std::uint32_t> t = iota_tokens(16);
  t.insert(t.end(), {5, 6});
  const RequestId r = b.kv.add_request(t);
  CHECK(b.kv.lookup_prefix(r) == 16);
  CHECK(b.kv.draft_recompute(r, kDraft) == TokenRange{12, 16});
  REQUIRE(b.kv.allocate(r, 2));
  // The draft row: pages 0-2 from the cache, fresh pages from position 12 on.
  CHECK(b.kv.page_table(r, kDraft).size() == 5);
  CHECK(b.kv.num_computed(r) == 16);
  b.kv.check_invariants();
}

TEST_CASE("speculative: draft pages age as their target's, or go first when evicted sooner", "[speculative]") {
  for (std::uint32_t sooner : {0u, 1u, 3u}) {
    Bench b(true, sooner);
    for (int i = 0; i < 5; ++i) b.eng.begin_step();
    EngineRequest a = b.add(iota_tokens(16));
    b.admit_and_prefill(a, 16);
    b.eng.begin_step();
    const PageId tp = b.kv.page_table(a.id, kTarget)[0], dp = b.kv.page_table(a.id, kDraft)[0];
    b.kv.free(a.id);
    const testing::ManagerInspector ins(b.kv);
    const EvictionKey tk = ins.eviction_key(kTarget, tp), dk = ins.eviction_key(kDraft, dp);
    CHECK(dk.time + sooner == tk.time);
    if (sooner == 0) {  // the same key: a draft page is worth its target page's tokens
      CHECK_FALSE(evicted_before(dk, tk));
      CHECK_FALSE(evicted_before(tk, dk));
    } else {  // older, and first among pages of its age
      CHECK(evicted_before(dk, tk));
    }
  }
}

TEST_CASE("speculative: bad input raises kvmm::Error naming the argument and changes nothing", "[speculative]") {
  Bench b(true);
  EngineRequest a = b.add(iota_tokens(9));
  REQUIRE(b.kv.lookup_prefix(a.id) == 0);
  REQUIRE(b.kv.allocate(a.id, 8));
  b.kv.commit(a.id, 8);
  auto raises = [&](auto&& call, const std::string& part) {
    try {
      call();
      FAIL("no kvmm::Error");
    } catch (const kvmm::Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(part) != std::string::npos);
    }
    b.kv.check_invariants();
    CHECK(b.kv.num_computed(a.id) == 8);
  };
  raises([&] { (void)b.kv.draft_recompute(a.id, kTarget); }, "group = 0");
  raises([&] { (void)b.kv.draft_recompute(a.id, 7); }, "group = 7");
  raises([&] { (void)b.kv.tag_state(a.id, kTarget, 8); }, "group = 0");
  raises([&] { (void)b.kv.tag_state(a.id, kState, 0); }, "state_tokens = 0");
  raises([&] { (void)b.kv.tag_state(a.id, kState, 10); }, "state_tokens = 10");
  CHECK(b.kv.tag_state(a.id, kState, 8));

  auto layout_raises = [](std::vector<LayerGroup> groups, const std::string& part) {
    try {
      (void)KVLayout::plan(std::move(groups));
      FAIL("no kvmm::Error");
    } catch (const kvmm::Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(part) != std::string::npos);
    }
  };
  const LayerGroup target = LayerGroup::full_attention("target", 1, 1, 8, 2, 4);
  LayerGroup draft = LayerGroup::full_attention("draft", 1, 1, 8, 2, 4);
  draft.draft = DraftRole{.target = "nope"};
  layout_raises({target, draft}, "draft.target = 'nope'");
  draft.draft = DraftRole{.target = "target", .successor_tokens = 9};
  layout_raises({target, draft}, "draft.successor_tokens = 9");
  // A target group keyed with successor ids: full attention only, at most 8, not a draft.
  LayerGroup keyed = target;
  keyed.successor_tokens = 9;
  layout_raises({keyed}, "successor_tokens = 9: at most 8");
  LayerGroup window = LayerGroup::sliding_window("window", 1, 1, 8, 2, 4, 8);
  window.successor_tokens = 1;
  layout_raises({target, window}, "'window': successor_tokens = 1: a sliding_window group");
  LayerGroup keyed_draft = draft;
  keyed_draft.draft = DraftRole{.target = "target", .successor_tokens = 1};
  keyed_draft.successor_tokens = 1;
  layout_raises({target, keyed_draft}, "a draft group's are draft.successor_tokens");
  LayerGroup merged = target;
  merged.successor_tokens = 1;
  try {
    KVCacheManager m(KVLayout::plan({merged}), {.num_large_pages = 8, .hit_unit = 2});
    FAIL("no kvmm::Error");
  } catch (const kvmm::Error& e) {
    CHECK(std::string(e.what()).find("hit_unit = 2: group 0 ('target') is keyed with 1 successor tokens") !=
          std::string::npos);
  }
  LayerGroup draft2 = LayerGroup::full_attention("draft2", 1, 1, 8, 2, 4);
  draft.draft = DraftRole{.target = "target"};
  draft2.draft = DraftRole{.target = "draft"};
  layout_raises({target, draft, draft2}, "draft.target = 'draft'");
  LayerGroup state = LayerGroup::mamba_state("state", 1, 256, 8);
  state.draft = DraftRole{.target = "target"};
  layout_raises({target, state}, "cannot be a draft");
  LayerGroup tagged = target;
  tagged.name = "t2";
  tagged.tagged_checkpoints = true;
  layout_raises({target, tagged}, "tagged_checkpoints");
}

// Router KV events: a successor-keyed draft page's key is no chain a router can follow, so
// it is announced neither when cached nor when evicted (before: never stored, but removed);
// a draft keyed without successors (s = 0) is announced both ways, as a target page is.
TEST_CASE("speculative: successor-keyed draft pages make no KV events, stored or removed", "[speculative]") {
  for (std::uint32_t s : {0u, 1u}) {
    CAPTURE(s);
    KVCacheManager kv(spec_layout(s, true),
                      {.num_large_pages = 12, .max_requests = 8, .record_events = true, .record_kv_events = true});
    SpecEngine eng(kv, s, true);
    std::mt19937_64 rng{1};
    std::uint64_t stored[3] = {}, removed[3] = {}, evicted_drafts = 0;
    KvEventBatch batch;
    std::vector<CacheEvent> pages;
    // Requests with distinct prompts, one after another, until the cache has evicted pages
    // of every group that caches through commit.
    for (std::uint32_t i = 0; i < 40 && (removed[0] == 0 || evicted_drafts == 0); ++i) {
      eng.begin_step();
      EngineRequest q;
      q.toks = iota_tokens(16, 1 + 100 * i);
      q.id = kv.add_request(q.toks);
      REQUIRE(kv.lookup_prefix(q.id) == 0);
      REQUIRE(kv.allocate(q.id, 16));
      eng.run_step(q, 16, 0, rng);
      eng.begin_step();
      REQUIRE(kv.allocate(q.id, 1));
      eng.run_step(q, 1, 0, rng);  // the successor of the last prompt page is known: cached
      kv.free(q.id);
      kv.take_events(pages);  // page events: every group's
      for (const CacheEvent& e : pages) evicted_drafts += e.kind == CacheEventKind::kRemoved && e.group == 2;
      kv.take_events(batch);
      for (const KvEvent& e : batch.events) {
        if (e.kind == KvEventKind::kStored) stored[e.group] += e.num_pages;
        if (e.kind == KvEventKind::kRemoved) removed[e.group] += e.num_pages;
      }
      kv.check_invariants();
    }
    CHECK(stored[0] > 0);
    CHECK(removed[0] > 0);
    CHECK(evicted_drafts > 0);  // draft pages were cached and evicted
    if (s == 0) {
      CHECK(stored[2] > 0);
      CHECK(removed[2] > 0);
    } else {
      CHECK(stored[2] == 0);
      CHECK(removed[2] == 0);
    }
  }
}

// A hit from a shared tier: the target's and the state's pages load from the tier, the
// draft (local pages only) recomputes its positions of the hit; no lost hit.
TEST_CASE("speculative: a tier hit loads target and state pages and recomputes the draft", "[speculative]") {
  Bench b(true);
  TierAdmission adm(b.kv);
  const RequestId r = b.kv.add_request(iota_tokens(20));
  REQUIRE(b.kv.lookup_prefix(r) == 0);
  std::vector<TierKey> keys;
  adm.tier_candidates(r, keys);
  for (const TierKey& k : keys) CHECK(k.group != kDraft);  // drafts take no part in the tier
  REQUIRE_FALSE(keys.empty());
  const std::vector<TierStatus> present(keys.size(), TierStatus::kOk);
  CHECK(adm.extend_prefix(r, present) == 16);
  REQUIRE(b.kv.allocate(r, 4));
  CHECK(b.kv.draft_recompute(r, kDraft) == TokenRange{0, 16});
  const std::vector<TierStatus> loaded(adm.tier_loads(r).size(), TierStatus::kOk);
  CHECK(adm.finish_loads(r, loaded) == 16);
  CHECK(b.kv.page_table(r, kDraft).size() == 5);  // fresh pages for positions 0-19
  b.kv.commit(r, 20);
  b.kv.check_invariants();
}
