// Traffic of the tensor-core prefill (kernels/tc_prefill.cuh) from the emulator's access
// log: every Q tile reads exactly its visible K/V range once (bytes requested = the sum
// over Q tiles of their key ranges), the chunk's DRAM-unique K/V bytes equal its visible
// K/V, whole 32-byte sectors only (at most 16 per cp.async request), ideal ldmatrix and
// shared-store wavefronts (the 128-byte swizzle), Q read once, page entries looked up once
// per KV-tile row (one warp request per 32 rows) or, with one page entry per tile, once
// per tile and warp; for both kernels (32 and 16 rows per warp), causal, window and chunked
// masks, page sizes 16 (row instance) and 64 (tile instance) and contiguous, chunks of 1
// to 200 tokens, single requests and ragged batches of 2-3, head dims 128 and 64 (16 rows
// per warp, the only form launched at 64).
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#define KVMM_SIMT_HOST 1
#include "../../kernels/attention_dispatch.cuh"
#include "../../kernels/tc_prefill.cuh"

#include <catch2/catch.hpp>

#include <random>

using namespace kvmm;
using namespace kvmm::kernels;
namespace dev = kvmm::kernels::device;

namespace {

struct PfTraffic {
  simt::TrafficReport rep;
  long long kv_requested_min = 0, kv_unique_min = 0, q_bytes = 0, pages_touched = 0, kv_tiles = 0;
};

// A ragged batch: request r a chunk of q_lens[r] tokens at the end of its 256-token
// context, 2 kv heads, group 4, head dim D (bf16), `tpp`-token pages (permuted, disjoint
// per request, page-layer layout of 2 layers; 64 and up: one page entry per KV tile) or
// contiguous slots (tpp 0); causal, a 50-token window or 48-token chunks; kMt m-tiles per
// warp.
template <int kMt, int D>
PfTraffic pf_traffic(std::uint32_t tpp, MaskKind mask, const std::vector<std::uint32_t>& q_lens) {
  constexpr std::uint32_t kv_heads = 2, group = 4, kv_len = 256, layers = 2, window = 50, chunk = 48;
  constexpr std::uint32_t q_heads = kv_heads * group, row_bytes = kv_heads * D * 2;
  const std::uint32_t batch = static_cast<std::uint32_t>(q_lens.size());
  const bool paged = tpp != 0;
  const std::uint32_t page_tokens = paged ? tpp : 16;
  const std::uint64_t page_stride = std::uint64_t{layers} * 2 * page_tokens * row_bytes;
  const std::uint32_t pages_per_req = kv_len / page_tokens, num_pages = batch * pages_per_req + 3;
  static std::vector<std::uint8_t> arena;
  arena.assign(num_pages * page_stride + 512, 0);
  std::mt19937 rng(7);
  for (auto& b : arena) b = static_cast<std::uint8_t>(rng() & 0x3f);
  char* base = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(arena.data()) + 255) & ~std::uintptr_t{255});
  // Page j of the batch (request j / pages_per_req) is j * mul + 3 mod num_pages, mul prime
  // to num_pages: a permutation, so requests share no page.
  const std::uint32_t mul = num_pages % 11 != 0 ? 11 : 13;
  std::vector<std::uint32_t> pages(batch * pages_per_req), indptr{0}, q_indptr{0}, lens(batch, kv_len), slots;
  for (std::uint32_t j = 0; j < pages.size(); ++j) pages[j] = (j * mul + 3) % num_pages;
  for (std::uint32_t r = 0; r < batch; ++r) {
    indptr.push_back((r + 1) * pages_per_req);
    q_indptr.push_back(q_indptr.back() + q_lens[r]);
    slots.push_back(r + 1);
  }
  const std::uint32_t rows = q_indptr.back();
  std::vector<std::uint16_t> q(std::size_t{rows} * q_heads * D, 0x3f80), o(q.size());
  QueryBatch qb{q.data(), o.data(), rows, batch, q_heads, lens.data(), q_indptr.data()};
  AttentionOptions opt;
  opt.mask = mask;
  opt.window = window;
  opt.chunk = chunk;
  constexpr std::uint32_t qrows = dev::kPfRows * kMt;
  const dev::AttnArgs a = dev::pf_args(dev::make_args(qb, opt, SplitKV{}, kv_heads, D), qrows);
  const dim3 grid(dev::pf_grid_x(rows, batch, group, qrows), kv_heads * a.head_chunks, 1);
  PfTraffic t;
  bool ok;
  {
    simt::TrafficLog log;
    if (paged) {
      const dev::TcPagedAddr kv{
          base, base + page_tokens * row_bytes, page_stride, row_bytes, D * 2, indptr.data(), pages.data(),
          0,    dev::FastDiv::make(tpp)};
      if (dev::pf_tile_in_page(kv))
        ok = simt::launch(grid, dev::kPfThreads,
                          [&] { dev::tc_prefill_kernel<dev::BFloat, D, dev::TcPagedAddr, true, true, kMt>(a, kv); });
      else
        ok = simt::launch(grid, dev::kPfThreads,
                          [&] { dev::tc_prefill_kernel<dev::BFloat, D, dev::TcPagedAddr, false, true, kMt>(a, kv); });
    } else {
      // Slots 1 .. batch of K, then V's after K's last.
      const std::uint64_t slot_stride = std::uint64_t{kv_len} * row_bytes;
      REQUIRE(2 * (batch + 1) * slot_stride <= arena.size() - 512);
      const dev::ContiguousAddr kv{base, base + (batch + 1) * slot_stride, slot_stride, row_bytes, D * 2, slots.data()};
      ok = simt::launch(grid, dev::kPfThreads,
                        [&] { dev::tc_prefill_kernel<dev::BFloat, D, dev::ContiguousAddr, true, true, kMt>(a, kv); });
    }
    REQUIRE(ok);
    t.rep = log.analyse(
        {{"kv", arena.data(), arena.size()}, {"pages", pages.data(), pages.size() * 4}, {"q", q.data(), q.size() * 2}});
  }
  // Per Q tile of tq tokens: the union of its rows' key ranges, K and V, each kv head; per
  // request the union of its tiles' (its pages and slot are its own).
  const std::uint32_t tq = dev::pf_tokens(group, qrows);
  for (const std::uint32_t q_len : q_lens) {
    std::uint32_t lo_all = kv_len;
    for (std::uint32_t t0 = 0; t0 < q_len; t0 += tq) {
      const std::uint32_t first = kv_len - q_len + t0, last = first + std::min(tq, q_len - t0) - 1;
      const std::uint32_t lo = key_range(mask, window, chunk, first).lo, hi = key_range(mask, window, chunk, last).hi;
      t.kv_requested_min += std::int64_t{hi - lo} * kv_heads * D * 2 * 2;
      for (std::uint32_t p = lo / page_tokens * page_tokens; p < hi; p += page_tokens) ++t.pages_touched;
      t.kv_tiles += kv_heads * ((hi - lo / 64 * 64 + 63) / 64);
      lo_all = std::min(lo_all, lo);
    }
    t.kv_unique_min += std::int64_t{kv_len - lo_all} * kv_heads * D * 2 * 2;
  }
  t.q_bytes = static_cast<long long>(q.size()) * 2;
  return t;
}

struct TrafficCase {
  int mt, d;
  std::uint32_t tpp;  // 0: contiguous
  MaskKind mask;
  std::vector<std::uint32_t> q_lens;  // the batch's chunks
};

}  // namespace

TEST_CASE("tensor-core prefill: each Q tile reads its visible K/V once, ideal sectors and wavefronts",
          "[kernels][simt][traffic][tc_prefill]") {
  std::vector<TrafficCase> cases;
  for (int mt : {2, 1})
    for (std::uint32_t tpp : {16u, 0u})
      for (MaskKind mask : {MaskKind::kCausal, MaskKind::kSlidingWindow})
        for (std::uint32_t q_len : {64u, 37u, 100u}) cases.push_back({mt, 128, tpp, mask, {q_len}});
  for (int mt : {2, 1}) {  // chunked masks, the tile instance, chunks of 1 and 200 tokens
    cases.push_back({mt, 128, 64, MaskKind::kCausal, {100}});
    cases.push_back({mt, 128, 64, MaskKind::kSlidingWindow, {37}});
    cases.push_back({mt, 128, 64, MaskKind::kChunkedLocal, {64}});
    cases.push_back({mt, 128, 16, MaskKind::kChunkedLocal, {200}});
    cases.push_back({mt, 128, 0, MaskKind::kChunkedLocal, {1}});
    cases.push_back({mt, 128, 16, MaskKind::kCausal, {1}});
  }
  for (int mt : {2, 1}) {  // ragged batches: two and three requests in one launch
    cases.push_back({mt, 128, 16, MaskKind::kCausal, {37, 100}});
    cases.push_back({mt, 128, 64, MaskKind::kChunkedLocal, {1, 64, 20}});
    cases.push_back({mt, 128, 0, MaskKind::kSlidingWindow, {100, 5}});
  }
  // Head dim 64 (16 rows per warp): the 64-element rows' swizzle.
  cases.push_back({1, 64, 16, MaskKind::kCausal, {100}});
  cases.push_back({1, 64, 64, MaskKind::kSlidingWindow, {37}});
  cases.push_back({1, 64, 0, MaskKind::kChunkedLocal, {64}});
  cases.push_back({1, 64, 16, MaskKind::kChunkedLocal, {200}});
  cases.push_back({1, 64, 64, MaskKind::kCausal, {1}});
  for (const TrafficCase& c : cases) {
    INFO("rows per warp " << 16 * c.mt << " d " << c.d << " tpp " << c.tpp << " mask " << static_cast<int>(c.mask)
                          << " requests " << c.q_lens.size() << " first q_len " << c.q_lens[0]);
    const PfTraffic t = c.mt == 2   ? pf_traffic<2, 128>(c.tpp, c.mask, c.q_lens)
                        : c.d == 64 ? pf_traffic<1, 64>(c.tpp, c.mask, c.q_lens)
                                    : pf_traffic<1, 128>(c.tpp, c.mask, c.q_lens);
    const simt::GlobalStats& kv = t.rep.global.at("kv");
    CHECK(t.rep.misaligned == 0);
    CHECK(kv.bytes_requested == t.kv_requested_min);  // each tile's visible K/V once per kv head
    CHECK(kv.unique_bytes == t.kv_unique_min);        // DRAM-unique: the chunk's visible K/V
    // A full cp.async request of 32 lanes is 512 bytes of whole rows of one head: 16
    // sectors; boundary rows copy nothing, so the mean is at most 16; no partial sector.
    CHECK(kv.sectors_per_request() <= 16.0);
    CHECK(kv.sectors * 32 == kv.bytes_requested);
    if (c.q_lens.size() == 1 && c.q_lens[0] > 1 && c.mask != MaskKind::kChunkedLocal)
      CHECK(kv.sectors_per_request() > 14.0);
    CHECK(t.rep.ldmatrix.requests > 0);
    CHECK(t.rep.ldmatrix.wavefronts == t.rep.ldmatrix.ideal);
    CHECK(t.rep.shared.wavefronts == t.rep.shared.ideal);  // the cp.async stores too
    const simt::GlobalStats& q = t.rep.global.at("q");
    CHECK(q.unique_bytes == t.q_bytes);
    CHECK(t.rep.global.count("other") == 0);
    if (c.tpp != 0 && c.tpp % 64 != 0) {
      // Page entries: one warp request per 32 rows of a KV tile (warps 0-1, a tile ahead).
      CHECK(t.rep.global.at("pages").requests == 2 * t.kv_tiles);
      CHECK(t.rep.global.at("pages").unique_bytes <= t.pages_touched * 4);
    } else if (c.tpp != 0) {
      // One page entry per tile, read by each of the 4 warps as it issues the tile's copy.
      CHECK(t.rep.global.at("pages").requests == 4 * t.kv_tiles);
      CHECK(t.rep.global.at("pages").unique_bytes <= t.pages_touched * 4);
    }
  }
}

#endif
