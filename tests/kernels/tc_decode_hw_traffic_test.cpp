// Traffic of the tensor-core decode with heads across warps (kernels/tc_decode_hw.cuh,
// TcDecodeShape::warp_heads) in the host emulation (kernels/simt_traffic.hpp): K/V at the
// minimum bytes, whole sectors (16 per request as the L1 counts them, per half-warp), ideal
// ldmatrix wavefronts, page ids of every page read, null pages not read; and the read
// pattern it exists for: at every copy instruction the CTA's four warps read the same
// 16-byte piece of the same token row in four adjacent kv heads, and over a tile a CTA's
// reads of each token row form one whole, aligned run of 4 heads (1 KiB at head dim 128);
// today's CTA (one kv head) reads 256-byte runs, which the same check tells apart.
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#define KVMM_SIMT_HOST 1
#include "../../kernels/attention_dispatch.cuh"
#include "../../kernels/tc_decode_hw.cuh"

#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>
#include <tuple>

using namespace kvmm;
using namespace kvmm::kernels;
namespace dev = kvmm::kernels::device;

namespace {

struct HwTraffic {
  simt::TrafficReport rep;
  long long kv_min = 0, pages_used = 0, pages_total = 0;
  // The read pattern (from the log's records of the K/V arena), per CTA and token row (K
  // and V rows apart): the bytes the CTA read of the row, as maximal runs.
  long long rows_seen = 0;
  std::set<long long> run_lengths;  // every maximal run's length in bytes
  long long runs_misaligned = 0;    // runs not starting at a multiple of their length
  // Per (CTA, lane, access index): the warps whose copy read another row, another piece of
  // the head, or a head outside the CTA's four (0: the four warps copy in lockstep).
  long long lockstep_mismatch = 0, lockstep_groups = 0;
};

// bf16, head dim D, 2 requests x kv_len tokens (256 unless given), 8 kv heads (2 KiB token rows at D 128), group
// 4; paged (pages of `tpp` tokens in a 2-layer page-layer arena, permuted, every
// `null_every`-th null) or contiguous; `splits` pieces; `hw`: heads across warps, else
// today's swapped form.
template <int D>
HwTraffic hw_traffic(bool paged, std::uint32_t splits, std::uint32_t null_every, std::uint32_t tpp, bool hw,
                     std::uint32_t kv_len = 256) {
  constexpr std::uint32_t batch = 2, kv_heads = 8, group = 4, layers = 2;
  constexpr std::uint32_t q_heads = kv_heads * group, row_bytes = kv_heads * D * 2;
  const std::uint64_t page_stride = std::uint64_t{layers} * 2 * tpp * row_bytes;
  const std::uint32_t pages_per_req = (kv_len + tpp - 1) / tpp, num_pages = batch * pages_per_req + 3;
  static std::vector<std::uint8_t> arena;
  arena.assign(num_pages * page_stride + 4096, 0);
  char* base = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(arena.data()) + 2047) & ~std::uintptr_t{2047});
  std::mt19937 rng(7);
  for (char* c = base; c < reinterpret_cast<char*>(arena.data() + arena.size()); ++c)
    *c = static_cast<char>(rng() & 0x3f);
  std::vector<std::uint32_t> pages(batch * pages_per_req);
  HwTraffic t;
  for (std::uint32_t i = 0; i < pages.size(); ++i) {
    pages[i] = null_every > 0 && i % null_every == 0 ? kNullPageId : (i * 11 + 3) % num_pages;
    t.pages_used += pages[i] != kNullPageId;
  }
  t.pages_total = pages.size();
  std::vector<std::uint32_t> indptr(batch + 1), lens(batch, kv_len), slots{1, 0};
  for (std::uint32_t b = 0; b <= batch; ++b) indptr[b] = b * pages_per_req;
  std::vector<std::uint16_t> q(batch * q_heads * D, 0x3f80), o(batch * q_heads * D);
  std::vector<float> ws(attention_workspace_bytes(batch, q_heads, D, splits) / 4 + 4);
  QueryBatch qb{q.data(), o.data(), batch, batch, q_heads, lens.data(), nullptr};
  const dev::AttnArgs a = dev::make_tc_args(qb, AttentionOptions{}, SplitKV{splits, ws.data()}, kv_heads, D);
  const dim3 grid(batch, hw ? dev::tc_hw_chunks(kv_heads) : kv_heads, splits);
  constexpr int kSub = dev::tc_sub(D, 2);
  simt::TrafficLog log;
  auto run = [&](const auto& kv, auto tile) {
    using Addr = std::decay_t<decltype(kv)>;
    constexpr bool kTile = decltype(tile)::value;
    return simt::launch(grid, dev::kTcThreads, [&] {
      if (hw)
        dev::tc_decode_hw_kernel<dev::BFloat, D, Addr, kTile>(a, kv);
      else
        dev::tc_decode_kernel<dev::BFloat, D, Addr, kTile, 2, true, kSub>(a, kv);
    });
  };
  bool ok;
  if (paged) {
    const dev::TcPagedAddr kv{base, base + tpp * row_bytes, page_stride, row_bytes, D * 2, indptr.data(), pages.data(),
                              0,    dev::FastDiv::make(tpp)};
    ok = dev::tc_tile_in_page(kv) ? run(kv, std::true_type{}) : run(kv, std::false_type{});
  } else {
    const std::uint64_t slot_stride = std::uint64_t{kv_len} * row_bytes;
    const dev::ContiguousAddr kv{base, base + batch * slot_stride, slot_stride, row_bytes, D * 2, slots.data()};
    ok = run(kv, std::true_type{});
  }
  REQUIRE(ok);
  t.rep = log.analyse({{"kv", arena.data(), arena.size()}, {"pages", pages.data(), pages.size() * 4}});
  t.kv_min = std::int64_t{batch} * kv_len * kv_heads * D * 2 * 2;

  // The read pattern. Every K and V plane starts at a multiple of row_bytes from `base`
  // (page strides, plane offsets and slot strides are multiples of it): (address - base) /
  // row_bytes numbers the token row, the remainder is the byte in the row.
  const auto lo = reinterpret_cast<std::uintptr_t>(base),
             hi = reinterpret_cast<std::uintptr_t>(arena.data()) + arena.size();
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<std::pair<std::uint32_t, std::uint32_t> > > by_row;
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>,
           std::vector<std::pair<std::uint64_t, std::uint32_t> > >
      by_step;  // (cta, lane, access index) -> (row, byte in row) of each warp
  for (const simt::Access& r : log.records()) {
    if (r.space != simt::Space::kGlobal || r.bytes == 0 || r.addr < lo || r.addr >= hi) continue;
    const std::uint64_t row = (r.addr - lo) / row_bytes;
    const auto in_row = static_cast<std::uint32_t>((r.addr - lo) % row_bytes);
    by_row[{r.cta, row}].emplace_back(in_row, in_row + r.bytes);
    by_step[{r.cta, r.thread % 32, r.seq}].emplace_back(row, in_row);
  }
  for (auto& [key, spans] : by_row) {
    ++t.rows_seen;
    std::sort(spans.begin(), spans.end());
    std::uint32_t run_lo = spans.front().first, run_hi = spans.front().second;
    auto close = [&] {
      t.run_lengths.insert(run_hi - run_lo);
      t.runs_misaligned += run_lo % (run_hi - run_lo) != 0;
    };
    for (const auto& [a0, a1] : spans) {
      if (a0 > run_hi) {
        close();
        run_lo = a0;
      }
      run_hi = std::max(run_hi, a1);
    }
    close();
  }
  for (const auto& [key, reads] : by_step) {
    ++t.lockstep_groups;
    std::set<std::uint32_t> heads;
    bool same = reads.size() == dev::kTcWarps;
    for (const auto& [row, in_row] : reads) {
      heads.insert(in_row / (D * 2));
      same = same && row == reads.front().first && in_row % (D * 2) == reads.front().second % (D * 2);
    }
    const std::uint32_t h0 = *heads.begin();
    same = same && heads.size() == dev::kTcWarps && h0 % dev::kTcWarps == 0 && *heads.rbegin() == h0 + 3;
    t.lockstep_mismatch += !same;
  }
  return t;
}

}  // namespace

TEST_CASE("tensor-core decode, heads across warps: K/V at the minimum, whole 4-head runs of each token row",
          "[kernels][simt][traffic][tc_decode]") {
  for (bool paged : {true, false})
    for (std::uint32_t splits : {1u, 3u}) {  // 3 pieces of 256 keys: 86, 85, 85 (mid-tile starts)
      INFO("paged " << paged << " splits " << splits);
      const HwTraffic t = hw_traffic<128>(paged, splits, 0, 16, true);
      const simt::GlobalStats& kv = t.rep.global.at("kv");
      CHECK(t.rep.misaligned == 0);
      CHECK(kv.bytes_requested == t.kv_min);  // each K/V byte once
      CHECK(kv.unique_bytes == t.kv_min);
      CHECK(kv.sectors * 32 == kv.bytes_requested);  // no sector read in part
      CHECK(kv.half_warp_sectors == kv.sectors);     // each half-warp whole sectors of 8 rows
      if (splits == 1) CHECK(kv.sectors_per_request() == 16.0);
      if (splits == 1) CHECK(kv.half_warp_sectors_per_request() == 16.0);
      CHECK(t.rep.ldmatrix.wavefronts == t.rep.ldmatrix.ideal);
      CHECK(t.rep.ldmatrix.requests > 0);
      // Each CTA reads of every token row one aligned 1 KiB run (its 4 kv heads x 256 bytes),
      // the 4 warps at the same instruction on the same row and piece of 4 adjacent heads.
      CHECK(t.rows_seen == 2 * 2 * 256 * 2);  // (requests x CTAs per request) x tokens x (K, V)
      CHECK(t.run_lengths == std::set<long long>{1024});
      CHECK(t.runs_misaligned == 0);
      CHECK(t.lockstep_groups > 0);
      CHECK(t.lockstep_mismatch == 0);
      if (paged) {
        // Every page id read; each warp reads its tiles' entries itself (one warp request
        // per 16-token sub-tile, plus one per tile a split boundary cuts): 4 per (page, CTA),
        // the same words (L1 hits after the first warp's).
        const simt::GlobalStats& pg = t.rep.global.at("pages");
        CHECK(pg.unique_bytes == t.pages_total * 4);
        CHECK(pg.requests >= 4 * 2 * 2 * 16);  // warps x requests x CTAs per request x pages
        CHECK(pg.requests <= 4 * 2 * 2 * (16 + (splits - 1)));
      }
    }
  // Today's CTA (one kv head, 4 warps on alternate tiles) reads 256-byte runs of each row.
  const HwTraffic d = hw_traffic<128>(true, 1, 0, 16, false);
  CHECK(d.rep.global.at("kv").bytes_requested == d.kv_min);
  CHECK(d.run_lengths == std::set<long long>{256});
  CHECK(d.lockstep_mismatch == d.lockstep_groups);
  // Null pages (every third): their rows are not read; the rest as above.
  const HwTraffic n = hw_traffic<128>(true, 1, 3, 16, true);
  CHECK(n.rep.global.at("kv").bytes_requested == n.pages_used * 16 * 8 * 128 * 2 * 2);
  CHECK(n.run_lengths == std::set<long long>{1024});
  CHECK(n.lockstep_mismatch == 0);
}

TEST_CASE("tensor-core decode, heads across warps: head dim 64 and pages of 17 tokens",
          "[kernels][simt][traffic][tc_decode]") {
  // Head dim 64 (64-token warp tiles, their page ids spread over the lanes): 512-byte runs
  // (4 heads x 128 bytes). Pages of 17 tokens (each row finds its page, the `row` instance)
  // at both head dims: K/V at the minimum, whole sectors, the same runs and lockstep.
  struct Case {
    std::uint32_t d, tpp, splits;
    bool paged;
  };
  for (const Case& c : {Case{64, 16, 1, true}, Case{64, 16, 3, true}, Case{64, 16, 1, false}, Case{64, 17, 3, true},
                        Case{128, 17, 1, true}, Case{128, 17, 3, true}}) {
    INFO("d " << c.d << " tpp " << c.tpp << " splits " << c.splits << " paged " << c.paged);
    const HwTraffic t = c.d == 64 ? hw_traffic<64>(c.paged, c.splits, 0, c.tpp, true)
                                  : hw_traffic<128>(c.paged, c.splits, 0, c.tpp, true);
    const simt::GlobalStats& kv = t.rep.global.at("kv");
    CHECK(t.rep.misaligned == 0);
    CHECK(kv.bytes_requested == t.kv_min);
    CHECK(kv.unique_bytes == t.kv_min);
    CHECK(kv.sectors * 32 == kv.bytes_requested);
    CHECK(kv.half_warp_sectors == kv.sectors);
    CHECK(t.rep.ldmatrix.wavefronts == t.rep.ldmatrix.ideal);
    CHECK(t.run_lengths == std::set<long long>{4 * c.d * 2});
    CHECK(t.runs_misaligned == 0);
    CHECK(t.lockstep_mismatch == 0);
    if (c.paged) CHECK(t.rep.global.at("pages").unique_bytes == t.pages_total * 4);
  }
}

TEST_CASE("tensor-core decode at head dim 64, pages of 17 tokens: every warp's tiles read their own rows",
          "[kernels][simt][traffic][tc_decode]") {
  // The `row` instance at D 64 publishes its rows' offsets in the warp's shared slots per
  // 64-token tile; a lane still reading the previous tile's slots while another stores the
  // next tile's read a wrong K row (16 bytes of another row: partial sectors, K/V bytes
  // read twice and others never) until a __syncwarp separated them. It needs several tiles
  // per warp (1024 keys: 16 tiles, 4 per warp in today's CTA, 16 per warp across heads).
  for (bool hw : {false, true})
    for (std::uint32_t splits : {1u, 3u}) {
      INFO("hw " << hw << " splits " << splits);
      const HwTraffic t = hw_traffic<64>(true, splits, 0, 17, hw, 1024);
      const simt::GlobalStats& kv = t.rep.global.at("kv");
      CHECK(kv.bytes_requested == t.kv_min);
      CHECK(kv.unique_bytes == t.kv_min);
      CHECK(kv.sectors * 32 == kv.bytes_requested);
      CHECK(t.run_lengths == std::set<long long>{hw ? 4 * 64 * 2 : 64 * 2});
    }
}

#endif
