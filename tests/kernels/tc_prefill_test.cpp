// The tensor-core prefill kernel (kernels/tc_prefill.cuh, issue 37) through the host
// emulation against the CPU references: causal, window and chunked masks, GQA 1/4/8 (and
// 3 and 24, which pack unevenly), head dims 64/128, page sizes 1/16/17/64/512, null pages,
// CSR and dense tables, chunk sizes 1-300 in ragged batches, splits with the merge kernel,
// soft cap, both dtypes; its contiguous form bit-equal to the paged one; the one-rounded-P
// variant (FA2's numerics) within its own bound; keys growing along the sequence so that
// the lazy rescale (kPfLazy) fires mid-sequence. Both kernels: 32 rows per warp (the
// default, kMt 2) and 16 (the first, kMt 1).
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#define KVMM_SIMT_HOST 1
#include "../../kernels/tc_prefill.cuh"
#include "../../kernels/attention_dispatch.cuh"
#include "kernels/hnd_util.hpp"
#include "kernels/kernel_fixture.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;
namespace dev = kvmm::kernels::device;

namespace {

template <typename T, typename Addr, bool kTileInPage, bool kSplitP, int kMt>
bool run_pf(const dev::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d) {
  if (d == 64)
    return simt::launch(grid, dev::kPfThreads,
                        [&] { dev::tc_prefill_kernel<T, 64, Addr, kTileInPage, kSplitP, kMt>(a, kv); });
  return simt::launch(grid, dev::kPfThreads,
                      [&] { dev::tc_prefill_kernel<T, 128, Addr, kTileInPage, kSplitP, kMt>(a, kv); });
}

// The instance the launcher picks: one page entry per tile when pages hold whole tiles.
template <typename T, typename Addr, bool kSplitP, int kMt>
bool run_pf(const dev::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d) {
  if (dev::pf_tile_in_page(kv)) return run_pf<T, Addr, true, kSplitP, kMt>(a, kv, grid, d);
  if constexpr (std::is_same_v<Addr, dev::ContiguousAddr>)
    return false;
  else
    return run_pf<T, Addr, false, kSplitP, kMt>(a, kv, grid, d);
}

// The launch sequence of the tensor-core prefill (tc_prefill.cu), emulated.
template <typename Addr, bool kSplitP = true, int kMt = 2>
bool emulate_pf(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split, std::uint32_t kv_heads,
                std::uint32_t d, DType dtype, const Addr& kv) {
  const std::uint32_t qrows = dev::kPfRows * kMt;
  const dev::AttnArgs a = dev::pf_args(dev::make_args(q, opt, split, kv_heads, d), qrows);
  const dim3 grid(dev::pf_grid_x(q.rows, q.batch, a.group, qrows), kv_heads * a.head_chunks, a.num_splits);
  bool ok = dtype == DType::kF16 ? run_pf<dev::Half, Addr, kSplitP, kMt>(a, kv, grid, d)
                                 : run_pf<dev::BFloat, Addr, kSplitP, kMt>(a, kv, grid, d);
  if (ok && split.num_splits > 1) {
    ok = simt::launch(dim3(q.rows, q.q_heads), d, [&] {
      if (dtype == DType::kF16)
        dev::merge_kernel<dev::Half>(a, d);
      else
        dev::merge_kernel<dev::BFloat>(a, d);
    });
  }
  return ok;
}

template <bool kSplitP = true, int kMt = 2>
std::vector<std::uint16_t> pf_paged(Scenario& s, std::uint32_t splits, bool csr) {
  std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
  PagedAttentionParams p = s.paged_params(o.data(), splits, csr);
  std::vector<float> ws(attention_workspace_bytes(s.rows, s.q_heads, s.cfg.head_dim, splits) / 4 + 4);
  p.split.workspace = ws.data();
  check_params(p, true, true);
  const dev::TcPagedAddr kv = dev::tc_paged_addr(p);
  const bool ok = emulate_pf<dev::TcPagedAddr, kSplitP, kMt>(p.query, p.options, p.split, s.cfg.kv_heads,
                                                             s.cfg.head_dim, s.cfg.dtype, kv);
  REQUIRE(ok);
  return o;
}

template <int kMt = 2>
std::vector<std::uint16_t> pf_contiguous(Scenario& s, std::uint32_t splits) {
  std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
  ContiguousAttentionParams p = s.contiguous_params(o.data(), splits);
  std::vector<float> ws(attention_workspace_bytes(s.rows, s.q_heads, s.cfg.head_dim, splits) / 4 + 4);
  p.split.workspace = ws.data();
  check_params(p, true, true);
  const dev::ContiguousAddr kv = dev::contiguous_addr(p);
  REQUIRE(emulate_pf<dev::ContiguousAddr, true, kMt>(p.query, p.options, p.split, s.cfg.kv_heads, s.cfg.head_dim,
                                                     s.cfg.dtype, kv));
  return o;
}

// Times some row's running maximum of its scaled logits (log2 units, over 64-token tiles
// from key 0: causal, unsplit) jumps by more than the kernel's lazy-rescale threshold after
// its first tile: how often the kernel must rescale O (computed here from the data alone).
std::uint32_t lazy_jumps(const Scenario& s) {
  const std::uint32_t d = s.cfg.head_dim, group = s.cfg.group;
  const double sc = 1.4426950408889634 / std::sqrt(double(d));
  std::uint32_t jumps = 0;
  for (std::uint32_t b = 0; b < s.cfg.batch; ++b) {
    const std::uint32_t q_len = s.q_indptr[b + 1] - s.q_indptr[b];
    for (std::uint32_t i = 0; i < q_len; ++i) {
      const std::uint32_t pos = s.kv_lens[b] - q_len + i;
      for (std::uint32_t qh = 0; qh < s.q_heads; ++qh) {
        const std::uint16_t* qv = &s.q[(std::size_t{s.q_indptr[b] + i} * s.q_heads + qh) * d];
        double ref = -INFINITY;
        for (std::uint32_t t0 = 0; t0 <= pos; t0 += dev::kPfTile) {
          double mx = -INFINITY;
          for (std::uint32_t t = t0; t < std::min(t0 + dev::kPfTile, pos + 1); ++t) {
            const std::uint16_t* kv = &s.k_tok[b][(std::size_t{t} * s.cfg.kv_heads + qh / group) * d];
            double dot = 0.0;
            for (std::uint32_t e = 0; e < d; ++e) dot += to_float(s.cfg.dtype, qv[e]) * to_float(s.cfg.dtype, kv[e]);
            mx = std::max(mx, dot * sc);
          }
          if (mx > ref + dev::kPfLazy) {
            jumps += ref != -INFINITY ? 1u : 0u;
            ref = mx;
          }
        }
      }
    }
  }
  return jumps;
}

struct Case {
  MaskKind mask;
  std::uint32_t group, tpp, max_q, max_kv, batch;
};

}  // namespace

TEST_CASE("Q tiles pack a group's heads and cover ragged batches", "[kernels][tc_prefill]") {
  for (std::uint32_t rows : {64u, 128u})
    for (std::uint32_t g : {1u, 3u, 4u, 8u, 24u, 64u, 100u, 200u}) {
      const std::uint32_t hc = dev::pf_heads(g, rows), tq = dev::pf_tokens(g, rows);
      CHECK(hc * tq <= rows);
      CHECK(hc * tq > rows / 2);
      dev::AttnArgs a{};
      a.group = g;
      a = dev::pf_args(a, rows);
      CHECK(a.head_chunks * hc >= g);
      CHECK((a.head_chunks - 1) * hc < g);
    }
  CHECK(dev::pf_tokens(4, 128) == 32);  // Llama's group: 32 tokens x 4 heads per 128-row tile
  // Every (request, tile) pair gets exactly one virtual CTA index below the grid bound.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const std::uint32_t tq = std::uniform_int_distribution<std::uint32_t>(1, 64)(rng);
    const std::uint32_t batch = std::uniform_int_distribution<std::uint32_t>(1, 9)(rng);
    std::vector<std::uint32_t> ind(batch + 1, 0);
    for (std::uint32_t b = 0; b < batch; ++b)
      ind[b + 1] = ind[b] + std::uniform_int_distribution<std::uint32_t>(0, 300)(rng);
    const std::uint32_t grid = ind[batch] / tq + batch;
    std::vector<int> seen(grid, 0);
    for (std::uint32_t b = 0; b < batch; ++b)
      for (std::uint32_t t = 0; t * tq < ind[b + 1] - ind[b]; ++t) {
        const std::uint32_t x = ind[b] / tq + b + t;
        REQUIRE(x < grid);
        ++seen[x];
      }
    for (int n : seen) REQUIRE(n <= 1);
  }
}

TEST_CASE("emulated tensor-core prefill matches the CPU references", "[kernels][simt][tc_prefill]") {
  const Case cases[] = {
      {MaskKind::kCausal, 1, 16, 300, 340, 2},        {MaskKind::kCausal, 4, 17, 90, 200, 3},
      {MaskKind::kCausal, 8, 1, 40, 150, 3},          {MaskKind::kCausal, 4, 512, 120, 700, 2},
      {MaskKind::kSlidingWindow, 1, 17, 150, 260, 3}, {MaskKind::kSlidingWindow, 4, 16, 60, 220, 3},
      {MaskKind::kSlidingWindow, 8, 64, 30, 300, 2},  {MaskKind::kSlidingWindow, 3, 1, 50, 120, 3},
      {MaskKind::kChunkedLocal, 1, 1, 200, 230, 2},   {MaskKind::kChunkedLocal, 4, 512, 100, 300, 3},
      {MaskKind::kChunkedLocal, 8, 17, 24, 160, 3},   {MaskKind::kChunkedLocal, 24, 16, 6, 100, 2},
      {MaskKind::kCausal, 1, 17, 1, 90, 4},  // chunk size 1: decode-like rows
      {MaskKind::kCausal, 8, 16, 300, 320, 2},        {MaskKind::kSlidingWindow, 1, 512, 300, 600, 3},
  };
  std::uint32_t index = 0;
  for (const Case& k : cases) {
    ++index;
    std::mt19937_64 rng(9000 + index);
    ScenarioConfig c;
    c.prefill = true;
    c.options.mask = k.mask;
    c.options.window = std::uniform_int_distribution<std::uint32_t>(1, 130)(rng);
    c.options.chunk = std::uniform_int_distribution<std::uint32_t>(1, 130)(rng);
    c.group = k.group;
    c.tokens_per_page = k.tpp;
    c.head_dim = index % 3 == 0 ? 64 : 128;
    c.dtype = index % 4 < 2 ? DType::kBF16 : DType::kF16;
    c.options.soft_cap = index % 5 == 1 ? 1.5f : 0.0f;
    c.kv_heads = k.group >= 8 ? 1 : 2;
    c.batch = k.batch;
    c.max_kv_len = k.max_kv;
    c.max_q_len = k.max_q;
    c.nulls = static_cast<NullMode>(index % 3);
    c.seed = 9100 + index;
    Scenario s(c);
    s.fill_host_caches();
    const std::uint32_t splits = index % 4 == 3 ? 3 : 1;
    INFO("case " << index << " mask " << static_cast<int>(k.mask) << " group " << k.group << " tpp " << k.tpp << " d "
                 << c.head_dim << " bf16 " << (c.dtype == DType::kBF16) << " cap " << c.options.soft_cap << " nulls "
                 << static_cast<int>(c.nulls) << " splits " << splits << " rows " << s.rows);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_prefill_attention(s.paged_params(ref.data(), splits, true));
    simt::Emulator::get().set_schedule_seed(index % 2 == 0 ? 0 : 7);  // two lane schedules over the cases
    const auto got = pf_paged(s, splits, index % 3 != 0);
    const double err = max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2);
    CHECK(err <= 4.0 * unit_roundoff(c.dtype));
    // P rounded once to T (FA2's numerics, the faster variant): a looser bound.
    const double err1 = max_rel_error(c.dtype, pf_paged<false>(s, splits, true), widen(c.dtype, ref), 1e-2);
    CHECK(err1 <= 32.0 * unit_roundoff(c.dtype));  // 9-25 units seen
    // The first kernel (16 rows per warp, Q in registers), still selectable.
    const auto got16 = pf_paged<true, 1>(s, splits, index % 3 != 0);
    const double err16 = max_rel_error(c.dtype, got16, widen(c.dtype, ref), 1e-2);
    CHECK(err16 <= 4.0 * unit_roundoff(c.dtype));
    if (std::getenv("KVMM_TEST_VERBOSE") != nullptr)
      std::printf("case %u rows %u: %.2f / %.2f units of roundoff (16 rows per warp: %.2f)\n", index, s.rows,
                  err / unit_roundoff(c.dtype), err1 / unit_roundoff(c.dtype), err16 / unit_roundoff(c.dtype));
    if (!s.any_null && index % 2 == 1) CHECK(pf_contiguous(s, splits) == got);
    if (!s.any_null && index % 4 == 1) CHECK(pf_contiguous<1>(s, splits) == got16);
    simt::Emulator::get().set_schedule_seed(0);
  }
}

TEST_CASE("emulated tensor-core prefill on head-major caches equals token-major", "[kernels][simt][tc_prefill][hnd]") {
  for (const HndCase& h : hnd_cases(true, 128)) {
    const ScenarioConfig& c = h.cfg;
    OrderPair s(c);
    INFO(h.describe());
    REQUIRE(s.arenas_differ());
    std::vector<std::uint16_t> ref(s.hnd.out_elems());
    cpu::paged_prefill_attention(s.hnd.paged_params(ref.data(), h.splits, true));
    const auto got = pf_paged(s.hnd, h.splits, c.csr);
    CHECK(got == pf_paged(s.nhd, h.splits, c.csr));
    CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
    if (!s.hnd.any_null) CHECK(pf_contiguous(s.hnd, h.splits) == got);
  }
}

TEST_CASE("emulated tensor-core prefill rescales O when a row's maximum jumps", "[kernels][simt][tc_prefill]") {
  // Keys scaled up along the sequence (token t by 1 + t / 24): the rows' maxima grow by more
  // than the lazy-rescale threshold again and again, so O is rescaled mid-sequence (the
  // random cases of the test above rarely do after a row's first tile).
  // Page sizes 16 and 17 (row instances: the steady state without maxima and its rare
  // path) and 64 (one page entry per tile: at 32 rows per warp the maxima on every tile).
  for (const std::uint32_t tpp : {16u, 17u, 64u}) {
    const DType dtype = tpp == 17 ? DType::kF16 : DType::kBF16;
    ScenarioConfig c;
    c.prefill = true;
    c.options.mask = MaskKind::kCausal;
    c.group = 4;
    c.tokens_per_page = tpp;
    c.head_dim = 128;
    c.dtype = dtype;
    c.kv_heads = 2;
    c.batch = 2;
    c.max_kv_len = 420;
    c.max_q_len = 150;
    c.seed = tpp == 16 ? 9301 : tpp == 17 ? 9302 : 9303;
    Scenario s(c);
    for (std::uint32_t b = 0; b < c.batch; ++b) {
      const std::size_t tok_elems = std::size_t{c.kv_heads} * c.head_dim;
      for (std::size_t e = 0; e < s.k_tok[b].size(); ++e)
        s.k_tok[b][e] =
            from_float(dtype, to_float(dtype, s.k_tok[b][e]) * (1.0f + static_cast<float>(e / tok_elems) / 24.0f));
    }
    s.fill_host_caches();
    const std::uint32_t jumps = lazy_jumps(s);
    INFO("tpp " << tpp << " bf16 " << (dtype == DType::kBF16) << " rows " << s.rows << " jumps " << jumps);
    REQUIRE(jumps > 0);  // the data does drive rescales
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_prefill_attention(s.paged_params(ref.data(), 1, true));
    const auto want = widen(dtype, ref);
    CHECK(max_rel_error(dtype, pf_paged(s, 1, true), want, 1e-2) <= 4.0 * unit_roundoff(dtype));
    CHECK(max_rel_error(dtype, pf_paged<true, 1>(s, 1, true), want, 1e-2) <= 4.0 * unit_roundoff(dtype));
    CHECK(max_rel_error(dtype, pf_paged<false>(s, 1, true), want, 1e-2) <= 32.0 * unit_roundoff(dtype));
    CHECK(max_rel_error(dtype, pf_paged(s, 2, false), want, 1e-2) <= 4.0 * unit_roundoff(dtype));  // split pieces
  }
}

#endif
