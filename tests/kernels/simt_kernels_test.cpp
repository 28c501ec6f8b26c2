// The real device code of kernels/*.cuh, run on the host through the SIMT emulation of
// kernels/simt_host.hpp (CTAs as fibers, barriers and warp shuffles emulated), against
// the CPU references: attention (paged/contiguous, decode/prefill, every mask, GQA
// 1/4/8/16, page sizes 1/16/17, split-KV with the merge kernel, soft cap, both dtypes,
// all head dims, prefill row tiles; head-major caches equal to token-major ones bit for
// bit), write_kv (both orders) and copy_pages. It checks index arithmetic, masks, the online
// softmax, the team and split merges, and that every barrier and shuffle is reached by
// all threads of a CTA. It cannot check speed or the CUDA compiler.
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: this file runs in the
// release CI job only.
#else
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#define KVMM_SIMT_HOST 1
#include "../../kernels/attention_dispatch.cuh"
#include "../../kernels/cache_ops.cuh"
#include "kernels/hnd_util.hpp"
#include "kernels/kernel_fixture.hpp"

#include <catch2/catch.hpp>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;
namespace dev = kvmm::kernels::device;

namespace {

template <typename T, int G, typename Addr>
bool run_heads(const dev::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d) {
  switch (d) {
    case 64:
      return simt::launch(grid, dev::kThreads, [&] { dev::attention_kernel<T, 64, G, Addr>(a, kv); });
    case 128:
      return simt::launch(grid, dev::kThreads, [&] { dev::attention_kernel<T, 128, G, Addr>(a, kv); });
    default:
      return simt::launch(grid, dev::kThreads, [&] { dev::attention_kernel<T, 256, G, Addr>(a, kv); });
  }
}

// The launch sequence of launch_attention, emulated.
template <typename Addr>
bool emulate_attention(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split, std::uint32_t kv_heads,
                       std::uint32_t d, DType dtype, const Addr& kv) {
  const dev::AttnArgs a = dev::make_args(q, opt, split, kv_heads, d);
  const dim3 grid = dev::attention_grid(a, q.rows, kv_heads);
  const bool g4 = dev::heads_per_cta(a.group, q.q_indptr != nullptr) == 4;
  bool ok;
  if (dtype == DType::kF16) {
    ok = g4 ? run_heads<dev::Half, 4>(a, kv, grid, d) : run_heads<dev::Half, 8>(a, kv, grid, d);
  } else {
    ok = g4 ? run_heads<dev::BFloat, 4>(a, kv, grid, d) : run_heads<dev::BFloat, 8>(a, kv, grid, d);
  }
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

std::vector<std::uint16_t> run_paged(Scenario& s, std::uint32_t splits, bool csr) {
  std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
  PagedAttentionParams p = s.paged_params(o.data(), splits, csr);
  std::vector<float> ws(attention_workspace_bytes(s.rows, s.q_heads, s.cfg.head_dim, splits) / 4 + 4);
  p.split.workspace = ws.data();
  check_params(p, s.cfg.prefill, true);
  const dev::PagedAddr kv = dev::paged_addr(p);
  REQUIRE(emulate_attention(p.query, p.options, p.split, s.cfg.kv_heads, s.cfg.head_dim, s.cfg.dtype, kv));
  return o;
}

std::vector<std::uint16_t> run_contiguous(Scenario& s, std::uint32_t splits) {
  std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
  ContiguousAttentionParams p = s.contiguous_params(o.data(), splits);
  std::vector<float> ws(attention_workspace_bytes(s.rows, s.q_heads, s.cfg.head_dim, splits) / 4 + 4);
  p.split.workspace = ws.data();
  check_params(p, s.cfg.prefill, true);
  const dev::ContiguousAddr kv = dev::contiguous_addr(p);
  REQUIRE(emulate_attention(p.query, p.options, p.split, s.cfg.kv_heads, s.cfg.head_dim, s.cfg.dtype, kv));
  return o;
}

}  // namespace

TEST_CASE("emulated attention kernels match the CPU references", "[kernels][simt]") {
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  const std::uint32_t groups[] = {1, 4, 8, 16};
  const std::uint32_t page_sizes[] = {1, 16, 17};
  const std::uint32_t dims[] = {64, 128, 256};
  std::uint32_t index = 0;
  for (MaskKind mask : masks)
    for (std::uint32_t group : groups)
      for (std::uint32_t tpp : page_sizes) {
        ++index;
        std::mt19937_64 rng(9000 + index);
        ScenarioConfig c;
        c.options.mask = mask;
        c.options.window = std::uniform_int_distribution<std::uint32_t>(1, 50)(rng);
        c.options.chunk = std::uniform_int_distribution<std::uint32_t>(1, 50)(rng);
        c.group = group;
        c.tokens_per_page = tpp;
        c.prefill = index % 2 == 0;
        c.head_dim = dims[index % 3];
        c.dtype = index % 4 < 2 ? DType::kBF16 : DType::kF16;
        c.options.soft_cap = index % 5 == 1 ? 1.5f : 0.0f;
        c.kv_heads = group >= 8 ? 1 : 2;
        c.batch = 2;
        c.max_kv_len = 90;
        c.max_q_len = 11;  // several row tiles per request, the last one partial
        c.nulls = static_cast<NullMode>(index % 3);
        c.seed = 9100 + index;
        Scenario s(c);
        s.fill_host_caches();
        INFO("scenario " << index << " mask " << static_cast<int>(mask) << " group " << group << " tpp " << tpp
                         << " prefill " << c.prefill << " d " << c.head_dim << " bf16 " << (c.dtype == DType::kBF16)
                         << " cap " << c.options.soft_cap << " nulls " << static_cast<int>(c.nulls));
        const std::uint32_t splits = index % 2 ? 1 : 3;
        std::vector<std::uint16_t> ref(s.out_elems());
        auto hp = s.paged_params(ref.data(), splits, true);
        if (c.prefill)
          cpu::paged_prefill_attention(hp);
        else
          cpu::paged_decode_attention(hp);
        const auto got = run_paged(s, splits, index % 3 != 0);
        // fp32 accumulation against the double reference: a few units of roundoff.
        CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
        if (!s.any_null) CHECK(run_contiguous(s, splits) == got);
      }
}

TEST_CASE("emulated attention kernels on head-major caches equal token-major ones", "[kernels][simt][hnd]") {
  std::uint32_t compared = 0;
  for (bool prefill : {false, true})
    for (const HndCase& h : hnd_cases(prefill)) {
      const ScenarioConfig& c = h.cfg;
      OrderPair s(c);
      INFO(h.describe());
      REQUIRE(s.arenas_differ());
      std::vector<std::uint16_t> ref(s.hnd.out_elems()), ref_nhd(s.nhd.out_elems());
      auto hp = s.hnd.paged_params(ref.data(), h.splits, true);
      auto np = s.nhd.paged_params(ref_nhd.data(), h.splits, true);
      if (prefill) {
        cpu::paged_prefill_attention(hp);
        cpu::paged_prefill_attention(np);
      } else {
        cpu::paged_decode_attention(hp);
        cpu::paged_decode_attention(np);
      }
      CHECK(ref == ref_nhd);  // the reference reads the same values in the same order
      const auto got = run_paged(s.hnd, h.splits, c.csr);
      CHECK(got == run_paged(s.nhd, h.splits, c.csr));
      CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
      if (!s.hnd.any_null) {
        CHECK(run_contiguous(s.hnd, h.splits) == got);
        ++compared;
      }
    }
  CHECK(compared >= 20);
}

TEST_CASE("emulated prefill row tiles with groups that do not divide 8", "[kernels][simt]") {
  // Group 2 packs 4 rows per CTA, group 3 packs 2 (6 of 8 slots); the rows of one CTA
  // see different key ranges (causal end, window start, chunk start).
  std::uint32_t index = 0;
  for (std::uint32_t group : {2u, 3u})
    for (MaskKind mask : {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal}) {
      ++index;
      ScenarioConfig c;
      c.options.mask = mask;
      c.options.window = 5;
      c.options.chunk = 7;
      c.group = group;
      c.kv_heads = 2;
      c.tokens_per_page = 16;
      c.prefill = true;
      c.head_dim = 64;
      c.batch = 3;
      c.max_kv_len = 60;
      c.max_q_len = 13;
      c.seed = 9300 + index;
      Scenario s(c);
      s.fill_host_caches();
      INFO("group " << group << " mask " << static_cast<int>(mask));
      for (std::uint32_t splits : {1u, 3u}) {
        std::vector<std::uint16_t> ref(s.out_elems());
        cpu::paged_prefill_attention(s.paged_params(ref.data(), splits, true));
        const auto got = run_paged(s, splits, true);
        CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
      }
    }
}

TEST_CASE("emulated write_kv and copy_pages kernels match the references", "[kernels][simt]") {
  // write_kv in both orders (head-major: each head's head_dim x 2 bytes to its own run of the page).
  for (KVOrder order : {KVOrder::kTokenMajor, KVOrder::kHeadMajor})
    for (std::uint32_t d : {64u, 128u, 256u}) {
      INFO("order " << static_cast<int>(order) << " head_dim " << d);
      ScenarioConfig c;
      c.tokens_per_page = 17;
      c.head_dim = d;
      c.nulls = NullMode::kRandom;
      c.seed = 12;
      c.order = order;
      Scenario s(c);
      s.fill_host_caches();  // reference result in s.arena
      Buffer arena;
      arena.resize(s.arena.size());
      std::memset(arena.data(), 0x7b, arena.size());
      const Scenario::Writes w = s.writes();
      const auto n = static_cast<std::uint32_t>(w.page_ids.size());
      const std::uint32_t row = static_cast<std::uint32_t>(s.row_bytes());
      const PagedKVCache cache = s.paged_cache(arena.data());
      const dev::PagedDst dst =
          dev::paged_dst(PagedWriteParams{cache, w.k.data(), w.v.data(), w.page_ids.data(), w.offsets.data(), n});
      // Few CTAs so that the grid-stride loop wraps.
      REQUIRE(simt::launch(dim3(3), dev::kCopyThreads, [&] {
        dev::write_kv_kernel<dev::PagedDst>(
            static_cast<char*>(cache.k), static_cast<char*>(cache.v), reinterpret_cast<const uint4*>(w.k.data()),
            reinterpret_cast<const uint4*>(w.v.data()), n, row / 16, dst, dev::head_scatter(cache));
      }));
      CHECK(std::memcmp(arena.data(), s.arena.data(), arena.size()) == 0);

      Buffer cont;
      cont.resize(s.cont_k.size());
      Buffer cont_v;
      cont_v.resize(s.cont_v.size());
      const ContiguousKVCache ccache = s.contiguous_cache(cont.data(), cont_v.data());
      const dev::ContiguousDst cdst = dev::contiguous_dst(
          ContiguousWriteParams{ccache, w.k.data(), w.v.data(), w.slots.data(), w.positions.data(), n});
      REQUIRE(simt::launch(dim3(2), dev::kCopyThreads, [&] {
        dev::write_kv_kernel<dev::ContiguousDst>(static_cast<char*>(cont.data()), static_cast<char*>(cont_v.data()),
                                                 reinterpret_cast<const uint4*>(w.k.data()),
                                                 reinterpret_cast<const uint4*>(w.v.data()), n, row / 16, cdst,
                                                 dev::head_scatter(ccache));
      }));
      CHECK(std::memcmp(cont.data(), s.cont_k.data(), cont.size()) == 0);
      CHECK(std::memcmp(cont_v.data(), s.cont_v.data(), cont_v.size()) == 0);
    }

  // copy_pages: vector and byte paths, several CTAs per page.
  for (bool vectors : {true, false}) {
    const std::uint64_t page_bytes = vectors ? 4096 : 1001, stride = vectors ? 4160 : 1003;
    std::vector<unsigned char> a(20 * stride), b;
    std::mt19937_64 rng(13);
    for (auto& x : a) x = static_cast<unsigned char>(rng());
    b = a;
    const std::vector<PageId> src = {1, 4, 4, 9}, dstp = {2, 5, 6, 19};
    REQUIRE(simt::launch(dim3(4, 3), dev::kCopyThreads, [&] {
      dev::copy_pages_kernel(reinterpret_cast<char*>(a.data()), reinterpret_cast<const char*>(a.data()), stride, stride,
                             page_bytes, src.data(), dstp.data(), vectors);
    }));
    cpu::copy_pages(PageCopyParams{b.data(), b.data(), stride, stride, page_bytes, src.data(), dstp.data(), 4});
    CHECK(a == b);
  }
}

TEST_CASE("the emulator reports divergent barriers", "[kernels][simt]") {
  // A shuffle that only some lanes reach: a hang or garbage on a GPU, an error here.
  CHECK_FALSE(simt::launch(dim3(1), 32, [] {
    if (threadIdx.x < 16) (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
  }));
  float sum = 0.0f;
  CHECK(simt::launch(dim3(1), 32, [&] {
    float v = static_cast<float>(threadIdx.x);
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (threadIdx.x == 0) sum = v;
  }));
  CHECK(sum == 496.0f);  // 0 + 1 + ... + 31
}
#endif
