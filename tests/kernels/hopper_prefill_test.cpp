// The sm_90a prefill (kernels/hopper_prefill.cuh: wgmma, TMA, mbarrier, a producer and
// two consumer warpgroups) through the host emulation against the CPU reference
// cpu::paged_prefill_attention: causal, GQA 1/4/8, page sizes 8/16/32/64/128/512, ragged
// chunks in one launch (one token to longer than their Q tile), CSR and dense tables, null
// pages; within tc_prefill's bound (4 units of bf16 roundoff: P applied in two parts), and
// the round_p_once instance within tc_prefill's P-once bound (32 units; 6-23 seen).
// The emulated TMA poisons a stage until its barrier's phase completes and wgmma's
// accumulators until wgmma.wait_group, so a missing wait shows as NaN; a second warp
// schedule gives the same bits. The kernel also
// runs on the whole group's map of prefill_tma.hpp (a middle layer by its K plane). And
// the launch plan refuses what the kernel does not build, with kvmm::Error. Its traffic:
// each Q tile's 64-token KV tiles once, DRAM-unique bytes the keys in whole TMA boxes, Q's
// shared stores at the ideal wavefronts.
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#define KVMM_SIMT_HOST 1
#include "../../kernels/hopper_prefill.cuh"
#include "../../kernels/prefill_tma.hpp"
#include "kernels/hopper_prefill_config.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;
namespace dev = kvmm::kernels::device;

namespace {

// The launch of kernels/sm90a/hopper_prefill.cu, emulated (host pointers); kSplitP false:
// the round_p_once instance.
template <bool kSplitP = true>
std::vector<std::uint16_t> hp_paged(Scenario& s, bool csr) {
  std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
  const PagedAttentionParams p = s.paged_params(o.data(), 1, csr);
  check_params(p, true, true);
  const dev::HpLaunch l = dev::hp_plan(p);
  const dev::TensorMap map = dev::host_tensor_map(l.map);
  REQUIRE(simt::launch(l.grid, dev::kHpThreads,
                       [&] { dev::hopper_prefill_kernel<dev::BFloat, kSplitP>(map, l.args, l.kv); }));
  return o;
}

}  // namespace

TEST_CASE("sm_90a prefill (wgmma + TMA + mbarrier) matches the CPU reference under the emulator",
          "[kernels][simt][hopper][hopper_prefill]") {
  std::uint32_t index = 0;
  for (std::uint32_t group : {4u, 1u, 8u})
    for (std::uint32_t tpp : {16u, 64u, 8u, 128u}) {
      if (group != 4 && (tpp == 8 || tpp == 128)) continue;  // the odd page sizes at GQA 4 only
      ++index;
      ScenarioConfig c = hp_config(group, tpp, 9100 + index, 3, 200, 90);
      c.nulls = index % 3 == 2 ? NullMode::kRandom : NullMode::kNone;
      Scenario s(c);
      s.fill_host_caches();
      std::vector<std::uint16_t> ref(s.out_elems());
      cpu::paged_prefill_attention(s.paged_params(ref.data(), 1, true));
      const auto got = hp_paged(s, index % 2 == 0);
      const double err = max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2);
      INFO("group " << group << " tpp " << tpp << " rows " << s.rows << " nulls " << s.any_null << " error "
                    << err / unit_roundoff(c.dtype) << " units");
      CHECK(err <= 4.0 * unit_roundoff(c.dtype));
      // P rounded once (round_p_once, FA2/FA3's numerics): tc_prefill's looser bound.
      const double err1 = max_rel_error(c.dtype, hp_paged<false>(s, index % 2 == 1), widen(c.dtype, ref), 1e-2);
      INFO("P rounded once: error " << err1 / unit_roundoff(c.dtype) << " units");
      CHECK(err1 <= 32.0 * unit_roundoff(c.dtype));
      if (std::getenv("KVMM_TEST_VERBOSE") != nullptr)
        std::printf("group %u tpp %u rows %u: %.2f units (split P) / %.2f (P once)\n", group, tpp, s.rows,
                    err / unit_roundoff(c.dtype), err1 / unit_roundoff(c.dtype));
    }
}

TEST_CASE("sm_90a prefill: long chunks wrap both stages many times", "[kernels][simt][hopper_prefill]") {
  // Chunks of up to 300 tokens over contexts of up to 320 at GQA 4 (Q tiles of 16 tokens,
  // up to 5 KV tiles each, so each stage's barriers pass several phases).
  ScenarioConfig c = hp_config(4, 16, 9200, 2, 320, 300);
  Scenario s(c);
  REQUIRE(s.rows >= 100);  // the seed gives long chunks
  s.fill_host_caches();
  std::vector<std::uint16_t> ref(s.out_elems());
  cpu::paged_prefill_attention(s.paged_params(ref.data(), 1, true));
  const auto got = hp_paged(s, true);
  CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
  // Another interleaving of the warps (the producer, the two consumers' turns and waits):
  // the same bits.
  simt::Emulator::get().set_schedule_seed(7);
  const auto shuffled = hp_paged(s, true);
  simt::Emulator::get().set_schedule_seed(0);
  CHECK(shuffled == got);
}

TEST_CASE("sm_90a prefill: pages of 32 and 512 tokens, chunks of one token", "[kernels][simt][hopper_prefill]") {
  // The page sizes the plan accepts beside those above (512: a multiple of 64, several
  // pages per request; 32: two boxes per tile), and decode-like chunks of one token (Q
  // tiles of one token: every row past it is padding).
  struct Shape {
    std::uint32_t group, tpp, batch, max_kv, max_q;
  };
  const Shape shapes[] = {{4, 512, 2, 700, 120}, {1, 32, 3, 200, 90}, {8, 32, 3, 150, 1}, {4, 512, 2, 600, 1}};
  std::uint32_t index = 0;
  for (const Shape& sh : shapes) {
    ++index;
    ScenarioConfig c = hp_config(sh.group, sh.tpp, 0, sh.batch, sh.max_kv, sh.max_q);
    c.nulls = index % 2 == 0 ? NullMode::kRandom : NullMode::kNone;
    // The first seed whose longest request spans several pages (kv lengths are drawn in
    // 1 .. max_kv).
    std::optional<Scenario> sc;
    for (c.seed = 9600 + 16 * index;; ++c.seed) {
      sc.emplace(c);
      if (*std::max_element(sc->kv_lens.begin(), sc->kv_lens.end()) > sh.tpp) break;
    }
    Scenario& s = *sc;
    s.fill_host_caches();
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_prefill_attention(s.paged_params(ref.data(), 1, true));
    INFO("group " << sh.group << " tpp " << sh.tpp << " rows " << s.rows << " nulls " << s.any_null);
    CHECK(max_rel_error(c.dtype, hp_paged(s, index % 2 == 1), widen(c.dtype, ref), 1e-2) <=
          4.0 * unit_roundoff(c.dtype));
  }
}

TEST_CASE("sm_90a prefill traffic: each Q tile's KV tiles once, DRAM-unique bytes the visible K/V in whole boxes",
          "[kernels][simt][traffic][hopper_prefill]") {
  // TMA moves whole boxes of min(tpp, 64) tokens: a Q tile reads its causal range [0, keys)
  // rounded up to 64-token tiles, each tile once (boxes past the keys reload the last page,
  // masked), so per request the distinct bytes are its keys rounded up to whole boxes; the
  // Q stores into shared memory take the ideal wavefronts.
  for (std::uint32_t tpp : {16u, 64u, 128u}) {
    ScenarioConfig c = hp_config(4, tpp, 9700 + tpp, 3, 200, 90);
    Scenario s(c);
    s.fill_host_caches();
    std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
    const PagedAttentionParams p = s.paged_params(o.data(), 1, true);
    const dev::HpLaunch l = dev::hp_plan(p);
    const dev::TensorMap map = dev::host_tensor_map(l.map);
    simt::TrafficReport rep;
    {
      simt::TrafficLog log;
      const bool ok = simt::launch(l.grid, dev::kHpThreads,
                                   [&] { dev::hopper_prefill_kernel<dev::BFloat, true>(map, l.args, l.kv); });
      REQUIRE(ok);
      rep = log.analyse({{"kv", s.arena.data(), s.arena.size()}});
    }
    const std::uint32_t tq = l.args.rows_per_cta, box = std::min(tpp, 64u);
    const long long head_token_bytes = 2 * 128 * 2;  // K and V rows of one kv head
    long long requested = 0, unique = 0;
    for (std::uint32_t b = 0; b < c.batch; ++b) {
      const std::uint32_t q_len = s.q_indptr[b + 1] - s.q_indptr[b], kv_len = s.kv_lens[b];
      for (std::uint32_t t0 = 0; t0 < q_len; t0 += tq) {
        const std::uint32_t keys = kv_len - q_len + t0 + std::min(tq, q_len - t0);
        requested += std::int64_t{(keys + 63) / 64} * 64 * head_token_bytes * c.kv_heads;
      }
      unique += std::int64_t{(kv_len + box - 1) / box} * box * head_token_bytes * c.kv_heads;
    }
    INFO("tpp " << tpp << " rows " << s.rows);
    const simt::GlobalStats& kv = rep.global.at("kv");
    CHECK(kv.bytes_requested == requested);
    CHECK(kv.unique_bytes == unique);
    // The consumers' swizzled Q stores (K and V land by TMA and are read by wgmma: not
    // modelled): a whole 128-byte row per 8-lane phase, one wavefront each.
    CHECK(rep.shared.requests > 0);
    CHECK(rep.shared.wavefronts == rep.shared.ideal);
    CHECK(rep.misaligned == 0);
  }
}

TEST_CASE("sm_90a prefill through the group's tensor map (prefill_tma.hpp): a layer by its K plane",
          "[kernels][simt][hopper_prefill][tma]") {
  // One map for the whole 3-layer group (group_tensor_map_spec), the kernel pointed at
  // layer 1 by coordinate 3 = 2 (its K) and 3 (its V); layers 0 and 2 hold poison.
  for (std::uint32_t tpp : {16u, 64u}) {
    ScenarioConfig c = hp_config(4, tpp, 9400 + tpp, 3, 200, 90);
    c.nulls = NullMode::kRandom;
    Scenario s(c);
    const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("g", 3, c.kv_heads, 128, 2, tpp)});
    const std::uint64_t page_bytes = layout.small_page_bytes(0);
    Buffer arena;
    arena.resize(s.num_pages * page_bytes);
    std::memset(arena.data(), 0x7b, arena.size());
    auto* base = static_cast<char*>(arena.data());
    const PagedKVCache cache{
        base + layout.k_offset(0, 1), base + layout.v_offset(0, 1), page_bytes, tpp, c.kv_heads, 128, DType::kBF16};
    const Scenario::Writes w = s.writes();
    cpu::write_kv(PagedWriteParams{cache, w.k.data(), w.v.data(), w.page_ids.data(), w.offsets.data(),
                                   static_cast<std::uint32_t>(w.page_ids.size())});
    std::vector<std::uint16_t> ref(s.out_elems()), got(s.out_elems(), 0xffff);
    PagedAttentionParams p = s.paged_params(ref.data(), 1, true);
    p.cache = cache;
    cpu::paged_prefill_attention(p);
    p.query.o = got.data();
    check_params(p, true, true);
    dev::HpLaunch l = dev::hp_plan(p, s.num_pages);
    const dev::TensorMapSpec group = dev::group_tensor_map_spec(layout, 0, base, s.num_pages);
    for (int d = 0; d < 5; ++d) CHECK(group.box[d] == l.map.box[d]);  // the kernel's boxes either way
    const dev::TensorMap map = dev::host_tensor_map(group);
    l.kv.k_plane = 2;  // layer 1's K
    REQUIRE(simt::launch(l.grid, dev::kHpThreads, [&] { dev::hopper_prefill_kernel<dev::BFloat>(map, l.args, l.kv); }));
    INFO("tpp " << tpp << " nulls " << s.any_null);
    CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
  }
}

TEST_CASE("sm_90a prefill refuses what it does not build", "[kernels][hopper_prefill]") {
  Scenario s(hp_config(4, 16, 9300, 3, 200, 90));
  std::vector<std::uint16_t> o(s.out_elems());
  const PagedAttentionParams ok = s.paged_params(o.data(), 1, true);
  CHECK_NOTHROW(dev::hp_plan(ok));
  auto bad = [&](auto mutate, const char* needle) {
    PagedAttentionParams p = ok;
    mutate(p);
    CHECK_THROWS_WITH(dev::hp_plan(p), Catch::Contains(needle));
  };
  bad([](PagedAttentionParams& p) { p.cache.dtype = DType::kF16; }, "only bf16");
  bad([](PagedAttentionParams& p) { p.cache.head_dim = 64; }, "head_dim = 64");
  bad([](PagedAttentionParams& p) { p.options.mask = MaskKind::kSlidingWindow; }, "causal");
  bad([](PagedAttentionParams& p) { p.options.soft_cap = 1.5f; }, "soft_cap");
  bad([](PagedAttentionParams& p) { p.split.num_splits = 2; }, "num_splits = 2");
  bad([](PagedAttentionParams& p) { p.cache.tokens_per_page = 17; }, "tokens_per_page = 17");
  bad([](PagedAttentionParams& p) { p.cache.tokens_per_page = 1; }, "tokens_per_page = 1:");
  bad([](PagedAttentionParams& p) { p.query.q_indptr = nullptr; }, "q_indptr");
  bad([](PagedAttentionParams& p) { std::swap(p.cache.k, p.cache.v); }, "cache.v - cache.k");
  bad([](PagedAttentionParams& p) { p.cache.page_stride_bytes += 8; }, "page_stride_bytes");
  // Head-major pages: the TMA map's strides are token-major (the message names the kernel).
  PagedAttentionParams hnd = ok;
  hnd.cache.order = KVOrder::kHeadMajor;
  CHECK_THROWS_WITH(dev::hp_plan(hnd), Catch::Contains("paged_prefill_attention_hopper") &&
                                           Catch::Contains("cache.order = 1 (head-major)"));
}

#endif
