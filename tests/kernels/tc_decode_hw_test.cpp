// The tensor-core decode with heads across warps (kernels/tc_decode_hw.cuh,
// TcDecodeShape::warp_heads: one CTA per (request, 4 kv heads, split piece), warp w on kv
// head 4 y + w walking every tile) through the host emulation against the CPU references:
// masks, soft cap, GQA 1-8, head dims 64/128, page sizes 1/16/17/32/64, null pages, CSR and
// dense tables, variable lengths, kv heads 4/8/12 and 6 (the last CTA's extra warps idle),
// splits 1-7 with the merge kernel and merged by the last CTA (several CTA orders, both
// grid orders), two lane schedules; contiguous = paged bit for bit; the launchers' checks
// and split counts. Its traffic: tests/kernels/tc_decode_hw_traffic_test.cpp.
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#define KVMM_SIMT_HOST 1
#include "../../kernels/tc_decode_hw.cuh"
#include "../../kernels/attention_dispatch.cuh"
#include "../../kernels/tc_decode_api.hpp"
#include "kernels/kernel_fixture.hpp"
#include "kernels/tc_decode_fixture.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;
namespace dev = kvmm::kernels::device;

namespace {

template <typename T, typename Addr>
bool run_hw(const dev::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d) {
  const bool tile = dev::tc_tile_in_page(kv);
  return simt::launch(grid, dev::kTcThreads, [&] {
    if (d == 64 && tile)
      dev::tc_decode_hw_kernel<T, 64, Addr, true>(a, kv);
    else if (d == 64)
      dev::tc_decode_hw_kernel<T, 64, Addr, false>(a, kv);
    else if (tile)
      dev::tc_decode_hw_kernel<T, 128, Addr, true>(a, kv);
    else
      dev::tc_decode_hw_kernel<T, 128, Addr, false>(a, kv);
  });
}

// The launch sequence of paged_decode_attention_tc with shape.warp_heads, emulated: the
// grid (requests, 4-kv-head chunks, splits), or with kv-head chunks along x; the merge
// kernel unless `counters` is set.
template <typename Addr>
bool emulate_hw(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split, std::uint32_t kv_heads,
                std::uint32_t d, DType dtype, const Addr& kv, std::uint32_t* counters, bool heads_first) {
  dev::AttnArgs a = dev::make_tc_args(q, opt, split, kv_heads, d);
  REQUIRE(dev::tc_swap(a, d));
  REQUIRE(a.head_chunks == 1);
  if (a.num_splits > 1) a.merge_counters = counters;
  a.heads_first = heads_first;
  const std::uint32_t c = dev::tc_hw_chunks(kv_heads);
  const dim3 grid = heads_first ? dim3(c, q.batch, a.num_splits) : dim3(q.batch, c, a.num_splits);
  bool ok = dtype == DType::kF16 ? run_hw<dev::Half>(a, kv, grid, d) : run_hw<dev::BFloat>(a, kv, grid, d);
  if (ok && split.num_splits > 1 && a.merge_counters == nullptr)
    ok = simt::launch(dim3(q.rows, q.q_heads), d, [&] {
      if (dtype == DType::kF16)
        dev::merge_kernel<dev::Half>(a, d);
      else
        dev::merge_kernel<dev::BFloat>(a, d);
    });
  return ok;
}

std::vector<std::uint16_t> hw_paged(Scenario& s, std::uint32_t splits, bool csr, std::uint32_t* counters = nullptr,
                                    bool heads_first = false) {
  return tc_paged_run(s, splits, csr, [&](const PagedAttentionParams& p, const dev::TcPagedAddr& kv) {
    REQUIRE(emulate_hw(p.query, p.options, p.split, s.cfg.kv_heads, s.cfg.head_dim, s.cfg.dtype, kv, counters,
                       heads_first));
  });
}

std::vector<std::uint16_t> hw_contiguous(Scenario& s, std::uint32_t splits, std::uint32_t* counters = nullptr,
                                         bool heads_first = false) {
  return tc_contiguous_run(s, splits, [&](const ContiguousAttentionParams& p, const dev::ContiguousAddr& kv) {
    REQUIRE(emulate_hw(p.query, p.options, p.split, s.cfg.kv_heads, s.cfg.head_dim, s.cfg.dtype, kv, counters,
                       heads_first));
  });
}

bool all_zero(const std::vector<std::uint32_t>& v) {
  return std::all_of(v.begin(), v.end(), [](std::uint32_t x) { return x == 0; });
}

}  // namespace

TEST_CASE("emulated tensor-core decode, heads across warps, matches the CPU references", "[kernels][simt][tc_decode]") {
  // 12 scenarios over the grid: every mask, page size and group of the swapped form, kv heads
  // 4/8/12/6 (6: the second CTA's warps 2 and 3 idle), splits 1-7 with the merge kernel,
  // CSR and dense tables, null pages, soft cap on some, lengths up to 330 (several 32- and
  // 64-token tiles per warp, the last one partial). Two lane schedules.
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  const std::uint32_t page_sizes[] = {1, 16, 17, 32, 64};
  const std::uint32_t groups[] = {1, 4, 8, 3, 2, 5, 7};
  const std::uint32_t kv_heads[] = {4, 8, 12, 6};
  const std::uint32_t split_counts[] = {1, 2, 3, 4, 5, 7};
  for (std::uint32_t index = 0; index < 12; ++index) {
    std::mt19937_64 rng(12000 + index);
    ScenarioConfig c;
    c.options.mask = masks[index % 3];
    c.options.window = std::uniform_int_distribution<std::uint32_t>(20, 250)(rng);
    c.options.chunk = std::uniform_int_distribution<std::uint32_t>(20, 250)(rng);
    c.options.soft_cap = index % 5 == 2 ? 1.5f : 0.0f;
    c.group = groups[index % 7];
    c.tokens_per_page = page_sizes[index % 5];
    c.head_dim = index % 2 == 0 ? 128 : 64;
    c.dtype = index % 4 < 2 ? DType::kBF16 : DType::kF16;
    c.kv_heads = kv_heads[index % 4];
    c.batch = 2;
    c.max_kv_len = 330;
    c.nulls = static_cast<NullMode>(index % 3);
    c.seed = 12100 + index;
    Scenario s(c);
    s.fill_host_caches();
    const std::uint32_t splits = split_counts[index % 6];
    const bool csr = index % 2 == 0;
    INFO("scenario " << index << " mask " << static_cast<int>(c.options.mask) << " group " << c.group << " tpp "
                     << c.tokens_per_page << " d " << c.head_dim << " kv_heads " << c.kv_heads << " cap "
                     << c.options.soft_cap << " nulls " << static_cast<int>(c.nulls) << " splits " << splits);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
    for (std::uint64_t seed : {0ull, 9ull}) {  // two lane schedules
      simt::Emulator::get().set_schedule_seed(seed);
      const auto got = hw_paged(s, splits, csr);
      // Every output written (the buffer starts as 0xffff, a NaN in both types).
      CHECK(std::none_of(got.begin(), got.end(), [](std::uint16_t x) { return x == 0xffff; }));
      CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
      if (!s.any_null) CHECK(hw_contiguous(s, splits) == got);
      // The grid with kv-head chunks along x: the same CTAs' work, the same bits.
      if (seed == 0) CHECK(hw_paged(s, splits, !csr, nullptr, true) == got);
    }
  }
  simt::Emulator::get().set_schedule_seed(0);
}

TEST_CASE("emulated tensor-core decode, heads across warps: split pieces merged by the last CTA",
          "[kernels][simt][tc_decode]") {
  // The counters are per (request, 4-kv-head chunk); the last CTA merges the q heads of its
  // chunk's kv heads (6 kv heads: the second chunk has 2). Under four CTA orders and two lane
  // schedules: merge_kernel's bits, within 4 ulp of the CPU reference, no visibility
  // violation, every counter zero afterwards, in both grid orders.
  struct Case {
    std::uint32_t tpp, group, d, kv_heads, splits;
    MaskKind mask;
    DType dtype;
    NullMode nulls;
  };
  const Case cases[] = {
      {16, 4, 128, 8, 3, MaskKind::kCausal, DType::kBF16, NullMode::kNone},
      {17, 8, 64, 4, 5, MaskKind::kSlidingWindow, DType::kF16, NullMode::kRandom},
      {64, 2, 64, 6, 7, MaskKind::kChunkedLocal, DType::kBF16, NullMode::kOutOfWindow},
      {1, 1, 128, 12, 2, MaskKind::kCausal, DType::kF16, NullMode::kNone},
      {32, 5, 128, 6, 4, MaskKind::kSlidingWindow, DType::kBF16, NullMode::kRandom},
  };
  std::uint32_t index = 0;
  for (const Case& k : cases) {
    ++index;
    ScenarioConfig c;
    c.options.mask = k.mask;
    c.options.window = 170;
    c.options.chunk = 130;
    c.group = k.group;
    c.tokens_per_page = k.tpp;
    c.head_dim = k.d;
    c.dtype = k.dtype;
    c.kv_heads = k.kv_heads;
    c.batch = 2;
    c.max_kv_len = 300;
    c.nulls = k.nulls;
    c.seed = 12800 + index;
    Scenario s(c);
    s.fill_host_caches();
    INFO("case " << index << " tpp " << k.tpp << " group " << k.group << " d " << k.d << " kv_heads " << k.kv_heads
                 << " splits " << k.splits);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), k.splits, true));
    const auto separate = hw_paged(s, k.splits, index % 2 == 0);
    CHECK(max_rel_error(c.dtype, separate, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
    std::set<std::uint32_t> mergers;
    for (auto [blocks, lanes] : {std::pair{0ull, 0ull}, {11ull, 7ull}, {12ull, 0ull}, {13ull, 3ull}}) {
      simt::Emulator::get().set_schedule_seed(lanes);
      simt::Emulator::get().set_block_order_seed(blocks);
      simt::GlobalOrder::get().reset_violations();
      std::vector<std::uint32_t> counters(experimental::tc_merge_counters(s.rows, s.q_heads), 0u);
      const auto got = hw_paged(s, k.splits, index % 2 == 0, counters.data());
      std::uint32_t z = 0;  // the piece of the CTA that ran last for (request 0, chunk 0): it merged
      for (const dim3& idx : simt::Emulator::get().block_order())
        if (idx.x == 0 && idx.y == 0) z = idx.z;
      mergers.insert(z);
      CHECK(got == separate);
      CHECK(simt::GlobalOrder::get().violations() == 0);
      CHECK(all_zero(counters));
      CHECK(hw_paged(s, k.splits, index % 2 == 0, counters.data(), true) == got);
      CHECK(simt::GlobalOrder::get().violations() == 0);
      CHECK(all_zero(counters));
      if (!s.any_null) CHECK(hw_contiguous(s, k.splits, counters.data()) == got);
      CHECK(all_zero(counters));
    }
    CHECK(mergers.size() > 1);  // the merging piece moved with the CTA order
  }
  simt::Emulator::get().set_schedule_seed(0);
  simt::Emulator::get().set_block_order_seed(0);
}

TEST_CASE("heads across warps: the launchers' checks and split counts", "[kernels][tc_decode]") {
  experimental::check_tc_warp_heads("k", {}, false);
  experimental::TcDecodeShape hw;
  hw.warp_heads = true;
  experimental::check_tc_warp_heads("k", hw, true);
  try {
    experimental::check_tc_warp_heads("paged_decode_attention_tc", hw, false);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("paged_decode_attention_tc: shape.warp_heads = true") != std::string::npos);
  }
  // One CTA per 4 kv heads: the splits of a cache with a quarter of the kv heads (groups of
  // at most 8); the default shape's count otherwise.
  CHECK(experimental::tc_choose_num_splits(16, 32, 8, 32768, 132, {}) == choose_num_splits(16, 32, 8, 32768, 132));
  CHECK(experimental::tc_choose_num_splits(16, 32, 8, 32768, 132, hw) == choose_num_splits(16, 2, 2, 32768, 132));
  CHECK(experimental::tc_choose_num_splits(16, 32, 8, 32768, 132, hw) == 9);  // 32 CTAs -> 264 / 32
  // 2 CTAs: 132 splits to fill the GPU, capped by 256 keys per split.
  CHECK(experimental::tc_choose_num_splits(1, 6, 6, 32768, 132, hw) == 128);
  CHECK(experimental::tc_choose_num_splits(256, 32, 8, 4096, 132, hw) == 1);  // 512 CTAs already
  // Groups over 8 run the 16-row form, which warp_heads refuses: the default's count.
  CHECK(experimental::tc_choose_num_splits(2, 64, 4, 100000, 100, hw) == choose_num_splits(2, 64, 4, 100000, 100));
}

#endif
