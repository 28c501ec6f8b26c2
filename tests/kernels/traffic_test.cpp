// Traffic accounting of the host emulation (kernels/simt_traffic.hpp): shared-memory
// wavefronts of ldmatrix over a K tile with and without the 128-byte XOR swizzle, global
// sectors per warp request for coalesced and strided patterns, and today's paged and
// contiguous decode kernels: K/V bytes requested and unique against the shape's minimum
// (each K/V byte once per kv head), 32-byte sectors per warp request, Q re-reads; the
// tensor-core decode (issue 36): K/V requested = the minimum (also with a split whose
// pieces start mid-tile), 16 sectors per request (counted per half-warp: 24 as shipped, 16
// by the sector lane map in every instance, with the same bits), page ids once per (page,
// CTA), ldmatrix at the ideal wavefront count, null pages read nothing.
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#define KVMM_SIMT_HOST 1
#include "../../kernels/attention_dispatch.cuh"
#include "../../kernels/tc_decode_probe.cuh"
#include "../../kernels/tensor_core.cuh"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <type_traits>

using namespace kvmm;
using namespace kvmm::kernels;
namespace dev = kvmm::kernels::device;

namespace {

// 4 warps read a 64-token x 128-dim bf16 K tile (256-byte rows) with ldmatrix.x4 as the
// B operand of S = Q K^T: warp w takes tokens 16w..16w+15, 16 columns per instruction.
// Swizzled: 16-byte chunk c of row r is stored at chunk c ^ (r % 8).
simt::SharedStats k_tile_wavefronts(bool swizzle) {
  alignas(16) static std::uint16_t tile[64 * 128];
  std::iota(tile, tile + 64 * 128, std::uint16_t{0});
  simt::TrafficLog log;
  REQUIRE(simt::launch(dim3(1), 128, [&] {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (unsigned kc = 0; kc < 16; kc += 2) {
      const unsigned row = warp * 16 + lane % 16, chunk = kc + lane / 16;
      const unsigned phys = swizzle ? chunk ^ (row % 8) : chunk;
      std::uint32_t r[4];
      dev::ldmatrix<4>(r, &tile[row * 128 + phys * 8]);
    }
  }));
  return log.analyse({}).ldmatrix;
}

}  // namespace

TEST_CASE("ldmatrix wavefronts: the 128-byte XOR swizzle is ideal, the plain layout 8x worse",
          "[kernels][simt][traffic]") {
  const simt::SharedStats plain = k_tile_wavefronts(false), swz = k_tile_wavefronts(true);
  CHECK(swz.requests == 32);  // 4 warps x 8 instructions
  CHECK(swz.ideal == 128);    // 4 matrices each
  CHECK(swz.wavefronts == 128);
  CHECK(plain.ideal == 128);
  CHECK(plain.wavefronts == 1024);
}

TEST_CASE("shared wavefronts of 4/8/16-byte accesses follow the bank rule", "[kernels][simt][traffic]") {
  alignas(16) static float s[32 * 32 * 4];
  simt::TrafficLog log;
  REQUIRE(simt::launch(dim3(1), 32, [&] {
    const unsigned lane = threadIdx.x;
    (void)dev::lds(&s[lane]);                                        // 32 words, 32 banks: 1
    (void)dev::lds(&s[lane * 32]);                                   // one bank: 32
    (void)dev::lds(&s[0]);                                           // broadcast: 1
    (void)dev::lds(reinterpret_cast<const float4*>(&s[lane * 4]));   // 4 phases of 8: 4
    (void)dev::lds(reinterpret_cast<const float4*>(&s[lane * 64]));  // every 4th... 8 lanes, 2 rows per bank group
  }));
  const auto& recs = log.records();
  REQUIRE(recs.size() == 5 * 32);
  auto group = [&](unsigned k) {
    std::vector<const simt::Access*> g;
    for (const auto& a : recs)
      if (a.seq == k) g.push_back(&a);
    return simt::TrafficLog::wavefronts(g);
  };
  CHECK(group(0) == std::pair<long long, long long>{1, 1});
  CHECK(group(1) == std::pair<long long, long long>{32, 1});
  CHECK(group(2) == std::pair<long long, long long>{1, 1});
  CHECK(group(3) == std::pair<long long, long long>{4, 4});
  // Lane l at word 64 l: the 8 lanes of a phase all start in bank 0: 8-way.
  CHECK(group(4) == std::pair<long long, long long>{32, 4});
}

TEST_CASE("global sectors per warp request: coalesced rows vs strided lanes", "[kernels][simt][traffic]") {
  static std::vector<std::uint8_t> g(1 << 17);
  auto* base =
      reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(g.data()) + 255) & ~std::uintptr_t{255});
  for (int pattern = 0; pattern < 3; ++pattern) {
    simt::TrafficLog log;
    REQUIRE(simt::launch(dim3(1), 32, [&] {
      const unsigned lane = threadIdx.x;
      // 0: two 256-byte rows, 16 lanes each (today's decode); 1: the same from a base
      // aligned to 16 bytes only; 2: one 16-byte piece per 2-KiB row.
      const std::size_t off =
          pattern == 2 ? lane * 2048 : (lane / 16) * 2048 + (lane % 16) * 16 + (pattern == 1 ? 16 : 0);
      (void)dev::ldg16(base + off);
    }));
    const auto rep = log.analyse({{"g", base, g.size() - 256}});
    const auto& s = rep.global.at("g");
    INFO("pattern " << pattern);
    CHECK(s.requests == 1);
    CHECK(s.bytes_requested == 512);
    CHECK(s.unique_bytes == 512);
    CHECK(s.sectors == (pattern == 0 ? 16 : pattern == 1 ? 18 : 32));
  }
}

TEST_CASE("a warp whose lanes log different call sites is counted as misaligned", "[kernels][simt][traffic]") {
  alignas(16) static std::uint8_t g[32 * 16 * 2];
  simt::TrafficLog log;
  // Launched outside REQUIRE: code inside a macro argument has one source line.
  const bool ok = simt::launch(dim3(1), 32, [&] {
    // Half the warp skips the first load instead of predicating it: the k-th records of
    // the lanes no longer belong to one instruction.
    if (threadIdx.x < 16) (void)dev::ldg16(&g[threadIdx.x * 16]);
    (void)dev::ldg16(&g[512 + threadIdx.x * 16]);
  });
  REQUIRE(ok);
  const auto rep = log.analyse({{"g", g, sizeof g}});
  CHECK(rep.misaligned == 1);               // record 0 of the warp: two sites
  CHECK(rep.global.at("g").requests == 1);  // record 1: lanes 0-15's second load
}

namespace {

struct DecodeTraffic {
  simt::TrafficReport rep;
  long long kv_min = 0, q_bytes = 0;
  std::uint32_t ctas = 0;
};

// Today's decode kernel (G 4, bf16, D 128) on 2 requests x 256 tokens, 2 kv heads, group 4;
// paged: 16-token pages in a 2-layer page-layer arena, pages permuted; else contiguous.
DecodeTraffic decode_traffic(bool paged, std::uint32_t misalign) {
  constexpr std::uint32_t batch = 2, kv_heads = 2, group = 4, D = 128, tpp = 16, kv_len = 256, layers = 2;
  constexpr std::uint32_t q_heads = kv_heads * group, row_bytes = kv_heads * D * 2;
  constexpr std::uint64_t page_stride = std::uint64_t{layers} * 2 * tpp * row_bytes;
  constexpr std::uint32_t pages_per_req = kv_len / tpp, num_pages = batch * pages_per_req + 3;
  static std::vector<std::uint8_t> arena;
  arena.assign(num_pages * page_stride + 512, 0);
  std::mt19937 rng(7);
  for (auto& b : arena) b = static_cast<std::uint8_t>(rng() & 0x3f);  // small bf16 values
  char* base =
      reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(arena.data()) + 255) & ~std::uintptr_t{255}) + misalign;
  std::vector<std::uint32_t> pages(batch * pages_per_req);
  for (std::uint32_t i = 0; i < pages.size(); ++i) pages[i] = (i * 11 + 3) % num_pages;
  std::vector<std::uint32_t> indptr(batch + 1), lens(batch, kv_len), slots{1, 0};
  for (std::uint32_t b = 0; b <= batch; ++b) indptr[b] = b * pages_per_req;
  std::vector<std::uint16_t> q(batch * q_heads * D, 0x3f80), o(batch * q_heads * D);
  QueryBatch qb;
  qb.q = q.data();
  qb.o = o.data();
  qb.rows = batch;
  qb.batch = batch;
  qb.q_heads = q_heads;
  qb.kv_lens = lens.data();
  const dev::AttnArgs a = dev::make_args(qb, AttentionOptions{}, SplitKV{}, kv_heads, D);
  const dim3 grid = dev::attention_grid(a, batch, kv_heads);
  DecodeTraffic t;
  t.ctas = grid.x * grid.y * grid.z;
  simt::TrafficLog log;
  bool ok;
  if (paged) {
    const dev::PagedAddr kv{base,          base + tpp * row_bytes, page_stride, tpp,  row_bytes,
                            indptr.data(), pages.data(),           0,           D * 2};
    ok = simt::launch(grid, dev::kThreads, [&] { dev::attention_kernel<dev::BFloat, 128, 4, dev::PagedAddr>(a, kv); });
  } else {
    // Two slots of kv_len tokens each, K and V in separate halves of the arena.
    const std::uint64_t slot_stride = std::uint64_t{kv_len} * row_bytes;
    const dev::ContiguousAddr kv{base, base + batch * slot_stride, slot_stride, row_bytes, D * 2, slots.data()};
    ok = simt::launch(grid, dev::kThreads,
                      [&] { dev::attention_kernel<dev::BFloat, 128, 4, dev::ContiguousAddr>(a, kv); });
  }
  REQUIRE(ok);
  t.rep = log.analyse({{"kv", arena.data(), arena.size()}, {"q", q.data(), q.size() * 2}});
  t.kv_min = std::int64_t{batch} * kv_len * kv_heads * D * 2 * 2;
  t.q_bytes = static_cast<long long>(q.size()) * 2;
  return t;
}

}  // namespace

TEST_CASE("today's decode kernel: K/V bytes at the minimum, 16 sectors per warp request", "[kernels][simt][traffic]") {
  for (bool paged : {true, false}) {
    INFO("paged " << paged);
    const DecodeTraffic t = decode_traffic(paged, 0);
    const simt::GlobalStats& kv = t.rep.global.at("kv");
    CHECK(t.rep.misaligned == 0);
    CHECK(kv.bytes_requested == t.kv_min);  // 524,288: each K/V byte once per kv head
    CHECK(kv.unique_bytes == t.kv_min);
    // A warp request is two 256-byte token rows (two teams of 16 lanes): 16 sectors.
    CHECK(kv.sectors_per_request() == 16.0);
    CHECK(kv.requests * 512 == t.kv_min);
    // Q: each of the 8 teams of a CTA reads the CTA's 4 heads (1 KiB): 8x the unique bytes.
    const simt::GlobalStats& q = t.rep.global.at("q");
    CHECK(q.unique_bytes == t.q_bytes);
    CHECK(q.bytes_requested == 8 * t.q_bytes);
    CHECK(t.rep.global.count("other") == 0);
  }
  // A base aligned to 16 bytes only: each 256-byte row straddles 9 sectors.
  const DecodeTraffic m = decode_traffic(true, 16);
  CHECK(m.rep.global.at("kv").sectors_per_request() == 18.0);
}

namespace {

struct TcTraffic {
  simt::TrafficReport rep;
  long long kv_min = 0, pages_used = 0;
  std::uint32_t ctas = 0;
  std::vector<std::uint16_t> o;   // the outputs (bf16 bits; splits 1)
  std::vector<std::uint32_t> ws;  // the split workspace's bits (the pieces' partials; splits > 1)
};

// The tensor-core decode (bf16, D 128, or 64: swapped operands with 64-token warp tiles)
// on 2 requests x 256 tokens, 2 kv heads, group 4; 16-token pages (permuted, page-layer
// layout of 2 layers), or contiguous; `splits` pieces; `null_every` > 0: every such page of
// the tables is null.
// probe (D 128, paged, tpp 16, swap): the limiter probe kernel (dev::kTcProbe*) instead.
// Body (not void): Body::template run<Addr, kTileInPage>(a, kv) is launched instead (any
// instance, TcBody below; then `swap` and `probe` are ignored).
template <std::uint32_t D = 128, typename Body = void>
TcTraffic tc_traffic(bool paged, std::uint32_t splits, std::uint32_t null_every, std::uint32_t tpp = 16,
                     bool swap = false, int probe = dev::kTcProbeNone) {
  static_assert(D == 128 || D == 64 || (D == 256 && !std::is_void_v<Body>));
  constexpr int kSub = dev::tc_sub(D, 2);
  constexpr std::uint32_t batch = 2, kv_heads = 2, group = 4, kv_len = 256, layers = 2;
  constexpr std::uint32_t q_heads = kv_heads * group, row_bytes = kv_heads * D * 2;
  const std::uint64_t page_stride = std::uint64_t{layers} * 2 * tpp * row_bytes;
  const std::uint32_t pages_per_req = (kv_len + tpp - 1) / tpp, num_pages = batch * pages_per_req + 3;
  static std::vector<std::uint8_t> arena;
  arena.assign(num_pages * page_stride + 512, 0);
  char* base = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(arena.data()) + 255) & ~std::uintptr_t{255});
  // The same bytes from `base` on whatever the arena's address (each instantiation has its own).
  std::mt19937 rng(7);
  for (char* c = base; c < reinterpret_cast<char*>(arena.data() + arena.size()); ++c)
    *c = static_cast<char>(rng() & 0x3f);
  std::vector<std::uint32_t> pages(batch * pages_per_req);
  TcTraffic t;
  for (std::uint32_t i = 0; i < pages.size(); ++i) {
    pages[i] = null_every > 0 && i % null_every == 0 ? kNullPageId : (i * 11 + 3) % num_pages;
    t.pages_used += pages[i] != kNullPageId;
  }
  std::vector<std::uint32_t> indptr(batch + 1), lens(batch, kv_len), slots{1, 0};
  for (std::uint32_t b = 0; b <= batch; ++b) indptr[b] = b * pages_per_req;
  std::vector<std::uint16_t> q(batch * q_heads * D, 0x3f80), o(batch * q_heads * D);
  std::vector<float> ws(attention_workspace_bytes(batch, q_heads, D, splits) / 4 + 4);
  QueryBatch qb;
  qb.q = q.data();
  qb.o = o.data();
  qb.rows = batch;
  qb.batch = batch;
  qb.q_heads = q_heads;
  qb.kv_lens = lens.data();
  const dev::AttnArgs a = dev::make_tc_args(qb, AttentionOptions{}, SplitKV{splits, ws.data()}, kv_heads, D);
  const dim3 grid(batch, kv_heads * a.head_chunks, splits);
  t.ctas = grid.x * grid.y * grid.z;
  simt::TrafficLog log;
  bool ok;
  if (paged) {
    const dev::TcPagedAddr kv{base, base + tpp * row_bytes, page_stride, row_bytes, D * 2, indptr.data(), pages.data(),
                              0,    dev::FastDiv::make(tpp)};
    if constexpr (!std::is_void_v<Body>)
      ok = simt::launch(grid, dev::kTcThreads, [&] {
        if (dev::tc_tile_in_page(kv))
          Body::template run<dev::TcPagedAddr, true>(a, kv);
        else
          Body::template run<dev::TcPagedAddr, false>(a, kv);
      });
    else if (dev::tc_tile_in_page(kv))
      ok = simt::launch(grid, dev::kTcThreads, [&] {
        if constexpr (D == 128) {
          if (probe == dev::kTcProbeLoadOnly) return dev::tc_decode_probe_kernel<dev::kTcProbeLoadOnly>(a, kv);
          if (probe == dev::kTcProbeMathOnly) return dev::tc_decode_probe_kernel<dev::kTcProbeMathOnly>(a, kv);
          if (probe == dev::kTcProbePlainMap) return dev::tc_decode_probe_kernel<dev::kTcProbePlainMap>(a, kv);
        }
        if (swap)
          dev::tc_decode_kernel<dev::BFloat, D, dev::TcPagedAddr, true, 2, true, kSub>(a, kv);
        else
          dev::tc_decode_kernel<dev::BFloat, D, dev::TcPagedAddr, true>(a, kv);
      });
    else
      ok = simt::launch(grid, dev::kTcThreads, [&] {
        if (swap)
          dev::tc_decode_kernel<dev::BFloat, D, dev::TcPagedAddr, false, 2, true, kSub>(a, kv);
        else
          dev::tc_decode_kernel<dev::BFloat, D, dev::TcPagedAddr, false>(a, kv);
      });
  } else {
    const std::uint64_t slot_stride = std::uint64_t{kv_len} * row_bytes;
    const dev::ContiguousAddr kv{base, base + batch * slot_stride, slot_stride, row_bytes, D * 2, slots.data()};
    ok = simt::launch(grid, dev::kTcThreads, [&] {
      if constexpr (!std::is_void_v<Body>)
        Body::template run<dev::ContiguousAddr, true>(a, kv);
      else if (swap)
        dev::tc_decode_kernel<dev::BFloat, D, dev::ContiguousAddr, true, 2, true, kSub>(a, kv);
      else
        dev::tc_decode_kernel<dev::BFloat, D, dev::ContiguousAddr, true>(a, kv);
    });
  }
  REQUIRE(ok);
  t.rep = log.analyse({{"kv", arena.data(), arena.size()}, {"pages", pages.data(), pages.size() * 4}});
  t.kv_min = std::int64_t{batch} * kv_len * kv_heads * D * 2 * 2;
  t.o = o;
  t.ws.resize(ws.size());
  std::memcpy(t.ws.data(), ws.data(), ws.size() * 4);
  return t;
}

// A tensor-core decode instance (its template arguments but the addressing) with the copy
// lane map of kProbe: dev::kTcProbeNone, what the kernels ship (both layouts copied by the
// exchanged map), or dev::kTcProbePlainMap (the old map: the plain layout copied by the
// stage map, lanes l and l + 16 the two halves of row l).
template <typename T, int D, int kStages, bool kSwap, int kSub, int kProbe>
struct TcBody {
  template <typename Addr, bool kTileInPage>
  static void run(const dev::AttnArgs& a, const Addr& kv) {
    dev::tc_decode_body<T, D, Addr, kTileInPage, kStages, kSwap, kSub, kProbe>(a, kv);
  }
};

}  // namespace

TEST_CASE("tensor-core decode: K/V at the minimum, ideal sectors and wavefronts, page ids once per page",
          "[kernels][simt][traffic][tc_decode]") {
  // Both forms: 16 q-head rows, and swapped operands with 32-token warp tiles (K and V
  // exchange shared layouts).
  for (bool swap : {false, true})
    for (bool paged : {true, false})
      for (std::uint32_t splits : {1u, 3u}) {  // 3 pieces of 256 keys: 86, 85, 85 (mid-tile starts)
        INFO("swap " << swap << " paged " << paged << " splits " << splits);
        const TcTraffic t = tc_traffic(paged, splits, 0, 16, swap);
        const simt::GlobalStats& kv = t.rep.global.at("kv");
        CHECK(t.rep.misaligned == 0);
        CHECK(kv.bytes_requested == t.kv_min);  // each K/V byte once per kv head
        CHECK(kv.unique_bytes == t.kv_min);
        // A cp.async request of 32 lanes: 32 bytes of each of the tile's 16 rows of one head,
        // 16 sectors; a tile a split boundary cuts has fewer rows per request. Either way no
        // sector is read in part: sectors x 32 = bytes.
        CHECK(kv.sectors * 32 == kv.bytes_requested);
        if (splits == 1) CHECK(kv.sectors_per_request() == 16.0);
        // Ideal sectors per request as the L1 counts them too (per half-warp of a 16-byte
        // request: simt::GlobalStats::half_warp_sectors): both layouts copied by the
        // exchanged lane map, each half-warp whole sectors of 8 rows.
        CHECK(kv.half_warp_sectors == kv.sectors);
        if (splits == 1) CHECK(kv.half_warp_sectors_per_request() == 16.0);
        CHECK(t.rep.ldmatrix.wavefronts == t.rep.ldmatrix.ideal);
        CHECK(t.rep.ldmatrix.requests > 0);
        if (paged) {
          // One warp request per (16-token page, CTA), plus one per tile a split boundary cuts.
          const simt::GlobalStats& pg = t.rep.global.at("pages");
          const long long per_cta_pages = 2 * 16 * 2;  // requests x pages x kv heads
          CHECK(pg.requests <= per_cta_pages + (splits - 1) * 2 * 2);
          CHECK(pg.requests >= per_cta_pages);
          CHECK(pg.unique_bytes == 2 * 16 * 4);
        }
      }
  // Null pages: their rows are neither read nor their page ids read twice.
  for (bool swap : {false, true}) {
    const TcTraffic n = tc_traffic(true, 1, 3, 16, swap);
    CHECK(n.rep.global.at("kv").bytes_requested == n.pages_used * 16 * 2 * 128 * 2 * 2);
  }
}

TEST_CASE("tensor-core decode at head dim 64 (64-token warp tiles): K/V at the minimum, page ids once per page",
          "[kernels][simt][traffic][tc_decode]") {
  // The swapped form with 4 sub-tiles per warp tile: the sub-tiles' page ids are read by
  // one warp request per tile (lane l: sub-tile l % 4), 4 pages of 16 tokens each.
  for (bool paged : {true, false})
    for (std::uint32_t splits : {1u, 3u}) {
      INFO("paged " << paged << " splits " << splits);
      const TcTraffic t = tc_traffic<64>(paged, splits, 0, 16, true);
      const simt::GlobalStats& kv = t.rep.global.at("kv");
      CHECK(t.rep.misaligned == 0);
      CHECK(kv.bytes_requested == t.kv_min);
      CHECK(kv.unique_bytes == t.kv_min);
      CHECK(kv.sectors * 32 == kv.bytes_requested);
      if (splits == 1) CHECK(kv.sectors_per_request() == 16.0);
      CHECK(kv.half_warp_sectors == kv.sectors);
      if (splits == 1) CHECK(kv.half_warp_sectors_per_request() == 16.0);
      CHECK(t.rep.ldmatrix.wavefronts == t.rep.ldmatrix.ideal);
      CHECK(t.rep.ldmatrix.requests > 0);
      if (paged) {
        // One warp request per (64-token tile, CTA): 4 per (request, kv head), plus one per
        // tile a split boundary cuts; every page id of the 16 per request read.
        const simt::GlobalStats& pg = t.rep.global.at("pages");
        CHECK(pg.requests >= 4 * 2 * 2);
        CHECK(pg.requests <= 4 * 2 * 2 + (splits - 1) * 2 * 2);
        CHECK(pg.unique_bytes == 2 * 16 * 4);
      }
    }
  // Null pages (every third): their rows are not read; pages of 17 tokens (each row finds
  // its page, the rows' lookups spread over the lanes): K/V at the minimum.
  const TcTraffic n = tc_traffic<64>(true, 1, 3, 16, true);
  CHECK(n.rep.global.at("kv").bytes_requested == n.pages_used * 16 * 2 * 64 * 2 * 2);
  for (std::uint32_t splits : {1u, 3u}) {
    INFO("17-token pages, splits " << splits);
    const TcTraffic r = tc_traffic<64>(true, splits, 0, 17, true);
    CHECK(r.rep.global.at("kv").bytes_requested == r.kv_min);
    CHECK(r.rep.global.at("kv").sectors * 32 == r.rep.global.at("kv").bytes_requested);
    // Two page-id requests per 64-token tile (lane l: rows l and l + 32): 4 tiles per
    // (request, kv head), plus two per tile a split boundary cuts; every page id read.
    const simt::GlobalStats& pg = r.rep.global.at("pages");
    CHECK(pg.requests >= 2 * 4 * 2 * 2);
    CHECK(pg.requests <= 2 * 4 * 2 * 2 + (splits - 1) * 2 * 2 * 2);
    CHECK(pg.unique_bytes == 2 * 16 * 4);
  }
}

TEST_CASE("tensor-core decode, pages of 17 tokens (each row finds its page): K/V at the minimum, whole sectors",
          "[kernels][simt][traffic][tc_decode]") {
  for (bool swap : {false, true})
    for (std::uint32_t splits : {1u, 3u}) {
      INFO("swap " << swap << " splits " << splits);
      const TcTraffic t = tc_traffic(true, splits, 0, 17, swap);
      const simt::GlobalStats& kv = t.rep.global.at("kv");
      CHECK(t.rep.misaligned == 0);
      CHECK(kv.bytes_requested == t.kv_min);
      CHECK(kv.unique_bytes == t.kv_min);
      CHECK(kv.sectors * 32 == kv.bytes_requested);  // a row's 32 bytes per request: one sector
      CHECK(kv.half_warp_sectors == kv.sectors);     // and its half-warp copies all of them
      CHECK(t.rep.ldmatrix.wavefronts == t.rep.ldmatrix.ideal);
      // One warp request of page ids per 16-token tile a CTA copies (its lanes' rows): 256
      // keys in 16 tiles per (request, kv head), plus one per tile a split boundary cuts.
      const simt::GlobalStats& pg = t.rep.global.at("pages");
      CHECK(pg.requests >= 2 * 16 * 2);
      CHECK(pg.requests <= 2 * 16 * 2 + (splits - 1) * 2 * 2);
      CHECK(pg.unique_bytes == 2 * 16 * 4);  // ceil(256 / 17) = 16 pages per request
    }
  // Null pages (every third): their rows are not read.
  const TcTraffic n = tc_traffic(true, 1, 3, 17);
  long long rows = 0;  // rows of the 256 that lie in used pages
  for (std::uint32_t i = 0; i < 16; ++i)
    if (i % 3 != 0) rows += std::min(17u, 256u - 17u * i);
  // Pages are numbered over both requests: page i of request 1 is entry 16 + i.
  long long rows1 = 0;
  for (std::uint32_t i = 0; i < 16; ++i)
    if ((16 + i) % 3 != 0) rows1 += std::min(17u, 256u - 17u * i);
  CHECK(n.rep.global.at("kv").bytes_requested == (rows + rows1) * 2 * 128 * 2 * 2);
}

// Every instance's copies under the half-warp count (the rule the H200's L1 counters fit:
// simt::GlobalStats::half_warp_sectors), the shipped sector map against the old plain map
// (dev::kTcProbePlainMap, the switch that keeps it): both layouts copied by the exchanged
// map (lanes 0-15 rows 0-7, lanes 16-31 rows 8-15) put whole sectors in each half-warp, so
// a request's half-warps touch disjoint sectors (half-warp sectors = sectors, 16 per request
// unsplit); the plain map (lanes l and l + 16 the two halves of row l) counts the plain
// layout's twice (24). Same bytes, same shared contents: the same output bits. The 16-row
// form at 3 stages ships the plain map (dev::tc_sector_map: the sector map spills it on
// sm_80): its shipped instance must then equal the plain map, traffic and bits.
template <typename T, int D, int kStages, bool kSwap, int kSub>
void check_copy_map(const char* what) {
  constexpr bool kSect = dev::tc_sector_map<kStages, kSwap>();
  using New = TcBody<T, D, kStages, kSwap, kSub, dev::kTcProbeNone>;
  using Old = TcBody<T, D, kStages, kSwap, kSub, dev::kTcProbePlainMap>;
  // 16-token pages (`tile`, or kSpread), 17 (`row`, or kRowSpread), contiguous (tpp 0).
  for (std::uint32_t tpp : {16u, 17u, 0u})
    for (std::uint32_t splits : {1u, 3u})
      for (std::uint32_t null_every : {0u, 3u}) {
        if (tpp == 0 && null_every != 0) continue;
        INFO(what << " tpp " << tpp << " splits " << splits << " null_every " << null_every);
        const bool paged = tpp != 0;
        const TcTraffic n = tc_traffic<D, New>(paged, splits, null_every, paged ? tpp : 16);
        const TcTraffic o = tc_traffic<D, Old>(paged, splits, null_every, paged ? tpp : 16);
        const simt::GlobalStats& nk = n.rep.global.at("kv");
        const simt::GlobalStats& ok = o.rep.global.at("kv");
        CHECK(n.rep.misaligned == 0);
        CHECK(nk.bytes_requested == ok.bytes_requested);
        CHECK(nk.unique_bytes == ok.unique_bytes);
        CHECK(nk.requests == ok.requests);
        CHECK(nk.sectors == ok.sectors);
        CHECK(nk.sectors * 32 == nk.bytes_requested);
        if (kSect)
          CHECK(nk.half_warp_sectors == nk.sectors);
        else
          CHECK(nk.half_warp_sectors == ok.half_warp_sectors);
        CHECK(ok.half_warp_sectors > ok.sectors);
        if (null_every == 0) CHECK(nk.bytes_requested == n.kv_min);
        if (splits == 1 && null_every == 0) {
          CHECK(nk.half_warp_sectors_per_request() == (kSect ? 16.0 : 24.0));
          CHECK(ok.half_warp_sectors_per_request() == 24.0);  // 32 for the plain layout, 16 the other
        }
        CHECK(n.rep.ldmatrix.wavefronts == n.rep.ldmatrix.ideal);
        CHECK(n.o == o.o);
        CHECK(n.ws == o.ws);
        if (splits == 1)
          CHECK(std::any_of(n.o.begin(), n.o.end(), [](std::uint16_t v) { return (v & 0x7fffu) != 0; }));
        else
          CHECK(std::any_of(n.ws.begin(), n.ws.end(), [](std::uint32_t v) { return (v & 0x7fffffffu) != 0; }));
      }
}

TEST_CASE("tensor-core decode: the sector lane map in every instance, the old plain map's bits",
          "[kernels][simt][traffic][tc_decode]") {
  using B = dev::BFloat;
  using H = dev::Half;
  // The 16-row form (issue1) at 2, 3 and 4 stages, head dims 64, 128, 256.
  check_copy_map<B, 128, 2, false, 1>("16-row D 128");
  check_copy_map<B, 128, 3, false, 1>("16-row D 128, 3 stages (the plain map)");
  static_assert(!dev::tc_sector_map<3, false>() && dev::tc_sector_map<3, true>() && dev::tc_sector_map<4, false>());
  check_copy_map<B, 128, 4, false, 1>("16-row D 128, 4 stages");
  check_copy_map<B, 64, 2, false, 1>("16-row D 64");
  check_copy_map<B, 256, 2, false, 1>("16-row D 256");
  check_copy_map<H, 128, 2, false, 1>("16-row D 128 fp16");
  // Swapped operands: 16-token tiles (t16, 3 stages), 32-token (kSub 2), 64-token at D 64
  // (kSub 4: kSpread, kRowSpread).
  check_copy_map<B, 128, 2, true, 1>("swapped D 128, 16-token tiles");
  check_copy_map<B, 128, 3, true, 1>("swapped D 128, 3 stages");
  check_copy_map<B, 128, 2, true, 2>("swapped D 128, 32-token tiles");
  check_copy_map<H, 128, 2, true, 2>("swapped D 128, 32-token tiles, fp16");
  check_copy_map<B, 64, 2, true, 4>("swapped D 64, 64-token tiles");
  check_copy_map<H, 64, 2, true, 4>("swapped D 64, 64-token tiles, fp16");
}

TEST_CASE("tensor-core decode limiter probes: the old plain lane map, load-only and math-only traffic",
          "[kernels][simt][traffic][tc_decode]") {
  // The default swapped 32-token form (what decode_paged_tc runs): 16 sectors per K/V
  // request, counted per half-warp too (simt::GlobalStats::half_warp_sectors, the rule the
  // H200's L1 counters fit): both layouts copied by the exchanged lane map.
  const TcTraffic def = tc_traffic(true, 1, 0, 16, true);
  const simt::GlobalStats& d = def.rep.global.at("kv");
  CHECK(d.sectors_per_request() == 16.0);
  CHECK(d.half_warp_sectors_per_request() == 16.0);
  // The plain-map probe (decode_paged_tc_plain, the map shipped before): K's plain lane map
  // gives lanes l and l + 16 the two 16-byte halves of row l: 32 per half-warp count, V's
  // exchanged map 16; 24 on average (the H200 run of 2026-11-28 measured 24.0 L1 sectors
  // per request). The same bytes and shared contents, so the same output bits.
  const TcTraffic plain = tc_traffic(true, 1, 0, 16, true, dev::kTcProbePlainMap);
  const simt::GlobalStats& s = plain.rep.global.at("kv");
  CHECK(plain.rep.misaligned == 0);
  CHECK(s.bytes_requested == plain.kv_min);
  CHECK(s.unique_bytes == plain.kv_min);
  CHECK(s.sectors_per_request() == 16.0);
  CHECK(s.half_warp_sectors_per_request() == 24.0);
  CHECK(plain.rep.ldmatrix.wavefronts == plain.rep.ldmatrix.ideal);
  CHECK(plain.o == def.o);
  CHECK(std::any_of(def.o.begin(), def.o.end(), [](std::uint16_t v) { return (v & 0x7fffu) != 0; }));
  // Load-only: the default's K/V requests exactly (the same map), no ldmatrix.
  const TcTraffic load = tc_traffic(true, 1, 0, 16, true, dev::kTcProbeLoadOnly);
  const simt::GlobalStats& l = load.rep.global.at("kv");
  CHECK(l.bytes_requested == load.kv_min);
  CHECK(l.requests == d.requests);
  CHECK(l.half_warp_sectors_per_request() == 16.0);
  CHECK(load.rep.ldmatrix.requests == 0);
  // Math-only: no K/V byte read, the default's ldmatrix work.
  const TcTraffic math = tc_traffic(true, 1, 0, 16, true, dev::kTcProbeMathOnly);
  CHECK(math.rep.global.count("kv") == 0);
  CHECK(math.rep.ldmatrix.requests == def.rep.ldmatrix.requests);
  CHECK(math.rep.global.at("pages").requests == def.rep.global.at("pages").requests);
}
#endif
