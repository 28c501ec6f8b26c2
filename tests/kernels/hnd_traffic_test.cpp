// The read pattern of one CTA under each KVOrder (issue 36's hypothesis H2), counted by the
// host emulation's traffic log (kernels/simt_traffic.hpp, GlobalStats::cta_runs): the
// tensor-core decode (the launchers' swapped 32-token form, bf16, D 128) and the default
// decode kernel, 2 requests x 128 tokens, 8 kv heads, group 4, 16-token pages (permuted, in
// a 2-layer page-layer arena) or contiguous slots. Token-major: each CTA (one kv head) reads
// 256-byte runs, one per token row of 2 KiB. Head-major: whole page tiles, 16 x 256 = 4 KiB
// contiguous runs (contiguous slots: the head's whole 32 KiB of K, and of V). The same bytes
// either way (each K/V byte once per kv head), 16 sectors per request. What that is worth in
// DRAM time a GPU says (bench rows decode_paged_tc_hnd, decode_paged_tc_kv1).
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#define KVMM_SIMT_HOST 1
#include "../../kernels/attention_dispatch.cuh"
#include "../../kernels/tc_decode.cuh"

#include <catch2/catch.hpp>

#include <random>
#include <vector>

using namespace kvmm;
using namespace kvmm::kernels;
namespace dev = kvmm::kernels::device;

namespace {

constexpr std::uint32_t kBatch = 2, kHeads = 8, kGroup = 4, kD = 128, kTpp = 16, kLen = 128, kLayers = 2;
constexpr std::uint32_t kRow = kHeads * kD * 2;  // one token's K row, all heads: 2 KiB

struct Pattern {
  simt::GlobalStats kv;
  long long kv_min = 0;
  std::uint32_t ctas = 0;
};

// `tc`: the tensor-core decode, else the default kernel; `paged`: 16-token pages, else
// contiguous slots; `order`: where (token, head) lies inside a page or slot.
Pattern read_pattern(bool tc, bool paged, KVOrder order) {
  const std::uint64_t page_stride = std::uint64_t{kLayers} * 2 * kTpp * kRow;
  const std::uint32_t per_req = kLen / kTpp, num_pages = kBatch * per_req + 3;
  const std::uint64_t slot_stride = std::uint64_t{kLen} * kRow;
  static std::vector<std::uint8_t> arena;
  arena.assign(std::max<std::uint64_t>(num_pages * page_stride, 2 * (kBatch + 1) * slot_stride) + 512, 0);
  char* base = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(arena.data()) + 255) & ~std::uintptr_t{255});
  std::mt19937 rng(3);
  for (auto& b : arena) b = static_cast<std::uint8_t>(rng() & 0x3f);  // small bf16 values
  std::vector<std::uint32_t> pages(kBatch * per_req), indptr(kBatch + 1), lens(kBatch, kLen), slots{2, 0};
  for (std::uint32_t i = 0; i < pages.size(); ++i) pages[i] = (i * 11 + 3) % num_pages;
  for (std::uint32_t b = 0; b <= kBatch; ++b) indptr[b] = b * per_req;
  std::vector<std::uint16_t> q(kBatch * kHeads * kGroup * kD, 0x3f80), o(q.size());
  QueryBatch qb{q.data(), o.data(), kBatch, kBatch, kHeads * kGroup, lens.data(), nullptr};
  PagedAttentionParams pp;
  pp.query = qb;
  pp.cache = PagedKVCache{base, base + kTpp * kRow, page_stride, kTpp, kHeads, kD, DType::kBF16, order};
  pp.table = PageTableView{indptr.data(), pages.data(), 0};
  ContiguousAttentionParams cp;
  cp.query = qb;
  cp.cache =
      ContiguousKVCache{base, base + (kBatch + 1) * slot_stride, slot_stride, kLen, kHeads, kD, DType::kBF16, order};
  cp.slot_idx = slots.data();
  if (paged)
    check_params(pp, false, true);
  else
    check_params(cp, false, true);
  Pattern t;
  simt::TrafficLog log;
  bool ok;
  if (tc) {
    const dev::AttnArgs a = dev::make_tc_args(qb, AttentionOptions{}, SplitKV{}, kHeads, kD);
    REQUIRE(dev::tc_swap(a, kD));
    const dim3 grid(kBatch, kHeads * a.head_chunks, 1);
    t.ctas = grid.x * grid.y;
    constexpr int kSub = dev::tc_sub(kD, 2);
    if (paged) {
      const dev::TcPagedAddr kv = dev::tc_paged_addr(pp);
      ok = simt::launch(grid, dev::kTcThreads,
                        [&] { dev::tc_decode_kernel<dev::BFloat, kD, dev::TcPagedAddr, true, 2, true, kSub>(a, kv); });
    } else {
      const dev::ContiguousAddr kv = dev::contiguous_addr(cp);
      ok = simt::launch(grid, dev::kTcThreads, [&] {
        dev::tc_decode_kernel<dev::BFloat, kD, dev::ContiguousAddr, true, 2, true, kSub>(a, kv);
      });
    }
  } else {
    const dev::AttnArgs a = dev::make_args(qb, AttentionOptions{}, SplitKV{}, kHeads, kD);
    const dim3 grid = dev::attention_grid(a, kBatch, kHeads);
    t.ctas = grid.x * grid.y * grid.z;
    if (paged) {
      const dev::PagedAddr kv = dev::paged_addr(pp);
      ok = simt::launch(grid, dev::kThreads, [&] { dev::attention_kernel<dev::BFloat, kD, 4, dev::PagedAddr>(a, kv); });
    } else {
      const dev::ContiguousAddr kv = dev::contiguous_addr(cp);
      ok = simt::launch(grid, dev::kThreads,
                        [&] { dev::attention_kernel<dev::BFloat, kD, 4, dev::ContiguousAddr>(a, kv); });
    }
  }
  REQUIRE(ok);
  t.kv = log.analyse({{"kv", arena.data(), arena.size()}, {"q", q.data(), q.size() * 2}}).global.at("kv");
  t.kv_min = std::int64_t{kBatch} * kLen * kHeads * kD * 2 * 2;
  return t;
}

}  // namespace

TEST_CASE("a CTA reads whole page tiles of head-major caches, 256-byte rows of token-major ones",
          "[kernels][simt][traffic][hnd]") {
  for (bool tc : {true, false})
    for (bool paged : {true, false}) {
      INFO("tensor-core " << tc << " paged " << paged);
      const Pattern nhd = read_pattern(tc, paged, KVOrder::kTokenMajor);
      const Pattern hnd = read_pattern(tc, paged, KVOrder::kHeadMajor);
      REQUIRE(nhd.ctas == kBatch * kHeads);
      for (const Pattern* p : {&nhd, &hnd}) {
        CHECK(p->kv.bytes_requested == p->kv_min);  // each K/V byte once per kv head
        CHECK(p->kv.unique_bytes == p->kv_min);
        CHECK(p->kv.sectors_per_request() == 16.0);
        if (tc) CHECK(p->kv.half_warp_sectors_per_request() == 16.0);
      }
      // Token-major: one 256-byte run per token of K and of V in every CTA.
      CHECK(nhd.kv.cta_run_min == kD * 2);
      CHECK(nhd.kv.cta_run_max == kD * 2);
      CHECK(nhd.kv.cta_runs == std::int64_t{nhd.ctas} * kLen * 2);
      // Head-major: a page's 16 tokens of the CTA's head in one 4 KiB run (K, V apart);
      // contiguous: the slot's 128 tokens of the head, 32 KiB.
      const long long run = paged ? kTpp * kD * 2 : kLen * kD * 2;
      CHECK(hnd.kv.cta_run_min == run);
      CHECK(hnd.kv.cta_run_max == run);
      CHECK(hnd.kv.cta_runs * run == hnd.kv_min);
    }
}

#endif
