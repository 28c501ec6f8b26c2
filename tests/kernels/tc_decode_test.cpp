// The tensor-core decode kernel (kernels/tc_decode.cuh, issue 36) through the host
// emulation against the CPU references: masks, GQA 1..16 and 24 (two head chunks), head
// dims 64/128/256, page sizes 1-512 (17 and 48 included), null pages, CSR and dense
// tables, variable lengths, splits with the merge kernel or merged by the last CTA inside
// the kernel (several CTA orders, a replay on the counters a launch left), soft cap, both
// dtypes, under two lane schedules; its contiguous form bit-equal to the paged one; head-major
// caches bit-equal to token-major ones; the multiply-shift division; the lane map against the swizzle. Its traffic:
// tests/kernels/traffic_test.cpp.
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#define KVMM_SIMT_HOST 1
#include "../../kernels/attention_dispatch.cuh"
#include "../../kernels/tc_decode_api.hpp"
#include "kernels/hnd_util.hpp"
#include "kernels/kernel_fixture.hpp"
#include "kernels/tc_decode_fixture.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <type_traits>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;
namespace dev = kvmm::kernels::device;

namespace {

template <typename T, typename Addr, bool kTileInPage, int kStages = dev::kTcStages, bool kSwap = false, int kSub = 1>
bool run_tc(const dev::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d) {
  // Head dim 64 runs 64-token warp tiles where 128 runs 32 (tc_sub).
  if (d == 64)
    return simt::launch(grid, dev::kTcThreads, [&] {
      dev::tc_decode_kernel<T, 64, Addr, kTileInPage, dev::kTcStages, kSwap, kSub == 2 ? dev::tc_sub(64, 2) : kSub>(a,
                                                                                                                    kv);
    });
  if (d == 128)
    return simt::launch(grid, dev::kTcThreads,
                        [&] { dev::tc_decode_kernel<T, 128, Addr, kTileInPage, kStages, kSwap, kSub>(a, kv); });
  if constexpr (!kSwap)
    return simt::launch(grid, dev::kTcThreads, [&] { dev::tc_decode_kernel<T, 256, Addr, kTileInPage>(a, kv); });
  return false;
}

template <typename T, typename Addr, bool kSwap>
bool run_tc(const dev::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d, int stages, bool tile32) {
  const bool tile = dev::tc_tile_in_page(kv);
  if constexpr (kSwap) {
    if (stages == 2 && tile32)
      return tile ? run_tc<T, Addr, true, 2, true, 2>(a, kv, grid, d)
                  : run_tc<T, Addr, false, 2, true, 2>(a, kv, grid, d);
  }
  if (stages == 3)
    return tile ? run_tc<T, Addr, true, 3, kSwap>(a, kv, grid, d) : run_tc<T, Addr, false, 3, kSwap>(a, kv, grid, d);
  if (stages == 4)
    return tile ? run_tc<T, Addr, true, 4, kSwap>(a, kv, grid, d) : run_tc<T, Addr, false, 4, kSwap>(a, kv, grid, d);
  return tile ? run_tc<T, Addr, true, 2, kSwap>(a, kv, grid, d) : run_tc<T, Addr, false, 2, kSwap>(a, kv, grid, d);
}

// The instance the launcher picks: one page entry per tile when pages hold whole tiles;
// swapped operands for groups of at most 8 at head dims up to 128 (tc_swap), unless
// `swap` is false, with 32-token warp tiles at 2 stages unless `tile32` is false; `stages`
// (2-4) the ring's depth at head dim 128.
template <typename T, typename Addr>
bool run_tc(const dev::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d, int stages, bool swap, bool tile32) {
  if (swap && dev::tc_swap(a, d)) return run_tc<T, Addr, true>(a, kv, grid, d, stages, tile32);
  return run_tc<T, Addr, false>(a, kv, grid, d, stages, tile32);
}

// The launch sequence of the tensor-core decode, emulated: the kernel, then the merge
// unless `counters` is set (the last CTA of each (request, kv head) merges); the grid
// with kv heads along x when `heads_first` (TcDecodeShape::heads_first), as the launcher.
template <typename Addr>
bool emulate_tc(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split, std::uint32_t kv_heads,
                std::uint32_t d, DType dtype, const Addr& kv, int stages = 2, bool swap = true, bool tile32 = true,
                std::uint32_t* counters = nullptr, bool heads_first = false) {
  dev::AttnArgs a = dev::make_tc_args(q, opt, split, kv_heads, d);
  if (a.num_splits > 1) a.merge_counters = counters;
  a.heads_first = heads_first && swap && dev::tc_swap(a, d);  // as the launcher: the swapped form only
  const dim3 grid = a.heads_first ? dim3(kv_heads * a.head_chunks, q.batch, a.num_splits)
                                  : dim3(q.batch, kv_heads * a.head_chunks, a.num_splits);
  bool ok = dtype == DType::kF16 ? run_tc<dev::Half>(a, kv, grid, d, stages, swap, tile32)
                                 : run_tc<dev::BFloat>(a, kv, grid, d, stages, swap, tile32);
  if (ok && split.num_splits > 1 && a.merge_counters == nullptr) {
    ok = simt::launch(dim3(q.rows, q.q_heads), d, [&] {
      if (dtype == DType::kF16)
        dev::merge_kernel<dev::Half>(a, d);
      else
        dev::merge_kernel<dev::BFloat>(a, d);
    });
  }
  return ok;
}

std::vector<std::uint16_t> tc_paged(Scenario& s, std::uint32_t splits, bool csr, int stages = 2, bool swap = true,
                                    bool tile32 = true, std::uint32_t* counters = nullptr, bool heads_first = false) {
  return tc_paged_run(s, splits, csr, [&](const PagedAttentionParams& p, const dev::TcPagedAddr& kv) {
    REQUIRE(emulate_tc(p.query, p.options, p.split, s.cfg.kv_heads, s.cfg.head_dim, s.cfg.dtype, kv, stages, swap,
                       tile32, counters, heads_first));
  });
}

std::vector<std::uint16_t> tc_contiguous(Scenario& s, std::uint32_t splits, std::uint32_t* counters = nullptr,
                                         bool heads_first = false) {
  return tc_contiguous_run(s, splits, [&](const ContiguousAttentionParams& p, const dev::ContiguousAddr& kv) {
    REQUIRE(emulate_tc(p.query, p.options, p.split, s.cfg.kv_heads, s.cfg.head_dim, s.cfg.dtype, kv, 2, true, true,
                       counters, heads_first));
  });
}

}  // namespace

TEST_CASE("FastDiv divides exactly by every page size kvmm plans", "[kernels][tc_decode]") {
  std::mt19937_64 rng(5);
  for (std::uint32_t d = 1; d <= 512; ++d) {
    const dev::FastDiv f = dev::FastDiv::make(d);
    for (std::uint32_t n : {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 0xffffffffu, 0xfffffffeu, 0x80000000u})
      REQUIRE(f.div(n) == n / d);
    for (int i = 0; i < 200; ++i) {
      const auto n = static_cast<std::uint32_t>(rng());
      REQUIRE(f.div(n) == n / d);
    }
  }
  for (std::uint32_t d : {0x7fffffffu, 0x80000001u, 0xfffffffbu})
    for (std::uint32_t n : {d - 1, d, 0xffffffffu}) REQUIRE(dev::FastDiv::make(d).div(n) == n / d);
}

TEST_CASE("emulated tensor-core decode matches the CPU references", "[kernels][simt][tc_decode]") {
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  const std::uint32_t groups[] = {1, 4, 8, 16, 24, 3};
  const std::uint32_t page_sizes[] = {1, 16, 17, 64};
  std::uint32_t index = 0;
  for (MaskKind mask : masks)
    for (std::uint32_t group : groups)
      for (std::uint32_t tpp : page_sizes) {
        ++index;
        if (index % 2 == 0 && tpp != 17) continue;  // about half the grid; 17 always
        std::mt19937_64 rng(7000 + index);
        ScenarioConfig c;
        c.options.mask = mask;
        c.options.window = std::uniform_int_distribution<std::uint32_t>(1, 60)(rng);
        c.options.chunk = std::uniform_int_distribution<std::uint32_t>(1, 60)(rng);
        c.group = group;
        c.tokens_per_page = tpp;
        c.head_dim = index % 3 == 0 ? 64 : 128;
        c.dtype = index % 4 < 2 ? DType::kBF16 : DType::kF16;
        c.options.soft_cap = index % 5 == 1 ? 1.5f : 0.0f;
        c.kv_heads = group >= 8 ? 1 : 2;
        c.batch = 3;
        c.max_kv_len = 150;  // several 16-token tiles per warp, the last one partial
        c.nulls = static_cast<NullMode>(index % 3);
        c.seed = 7100 + index;
        Scenario s(c);
        s.fill_host_caches();
        const std::uint32_t splits = index % 3 == 1 ? 3 : 1;
        INFO("scenario " << index << " mask " << static_cast<int>(mask) << " group " << group << " tpp " << tpp << " d "
                         << c.head_dim << " bf16 " << (c.dtype == DType::kBF16) << " cap " << c.options.soft_cap
                         << " nulls " << static_cast<int>(c.nulls) << " splits " << splits);
        std::vector<std::uint16_t> ref(s.out_elems());
        cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
        for (std::uint64_t seed : {0ull, 7ull}) {  // two lane schedules
          simt::Emulator::get().set_schedule_seed(seed);
          const auto got = tc_paged(s, splits, index % 3 != 0);
          // P is rounded to the storage type before P.V (as every tensor-core decode does):
          // within 4 units of roundoff of the double reference.
          CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
          if (!s.any_null) CHECK(tc_contiguous(s, splits) == got);
          // Groups of at most 8 run the swapped operands; the 16-row form serves them too.
          // (32-token warp tiles at 2 stages); the 16-row form and 16-token tiles serve them too.
          if (group <= 8 && seed == 0) {
            const auto rows16 = tc_paged(s, splits, index % 3 != 0, 2, false);
            CHECK(max_rel_error(c.dtype, rows16, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
            const auto tile16 = tc_paged(s, splits, index % 3 != 0, 2, true, false);
            CHECK(max_rel_error(c.dtype, tile16, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
          }
        }
        simt::Emulator::get().set_schedule_seed(0);
      }
}

TEST_CASE("the tensor-core decode's lane map lands on the swizzled chunks", "[kernels][tc_decode]") {
  // tc_lane_offset (q = j % 4) + 128 (j / 4) is chunk 2 j + hb of the row: every row, chunk
  // half and k-step of head dims 64, 128 and 256; and a warp's 32 lanes of one j cover 32
  // distinct 16-byte slots.
  auto check = [](auto dim) {
    constexpr int D = decltype(dim)::value;
    for (int j = 0; j < D / 16; ++j) {
      std::set<std::uint32_t> slots;
      for (std::uint32_t lane = 0; lane < 32; ++lane) {
        const std::uint32_t row = lane & 15, hb = lane >> 4;
        const std::uint32_t at = dev::tc_lane_offset<D>(row, hb, j & 3) + 128 * static_cast<std::uint32_t>(j >> 2);
        REQUIRE(at == dev::tc_swz<D>(row, static_cast<std::uint32_t>(2 * j) + hb));
        slots.insert(at / 16);
      }
      REQUIRE(slots.size() == 32);
    }
    // The exchanged layout's copy map (the sector probe copies the plain layout by it too):
    // lane l copies row krow = l % 8 + 8 (l / 16), 16-byte half khb = (l / 8) % 2 of each 32
    // bytes; the exchanged slot (row, 2 j + hb) holds exactly that row and half, the plain
    // layout's slot of it (krow, 2 j + khb) is the stage map's slot plus one per-lane constant
    // for every j (so one register, not four, could address it); each half-warp copies 8
    // rows' whole 32 bytes: 8 sectors, 16 per request.
    for (int j = 0; j < D / 16; ++j) {
      std::set<std::uint32_t> slots;
      std::set<std::uint32_t> sectors[2];
      for (std::uint32_t lane = 0; lane < 32; ++lane) {
        const std::uint32_t row = lane & 15, hb = lane >> 4;
        const std::uint32_t krow = (lane & 7) | ((lane >> 4) << 3), khb = (lane >> 3) & 1;
        const int pdelta = static_cast<int>(dev::tc_lane_offset<D>(krow, khb, 0)) -
                           static_cast<int>(dev::tc_lane_offset<D>(row, hb, 0));
        const std::uint32_t at = dev::tc_lane_offset<D>(row, hb, j & 3) + 128 * static_cast<std::uint32_t>(j >> 2);
        const std::uint32_t plain = static_cast<std::uint32_t>(static_cast<int>(at) + pdelta);
        REQUIRE(plain == dev::tc_swz<D>(krow, static_cast<std::uint32_t>(2 * j) + khb));
        slots.insert(plain / 16);
        // exchanged slot (r, c): row r % 8 + 8 (c % 2), chunk c - c % 2 + r / 8
        REQUIRE((row & 7) + 8 * ((2 * j + hb) % 2) == krow);
        REQUIRE(row / 8 == khb);
        // global bytes of the 32-byte row piece j: row krow x 4096 (any multiple of 32) + 32 j + 16 khb
        sectors[lane / 16].insert((krow * 4096 + 32 * static_cast<std::uint32_t>(j) + 16 * khb) / 32);
      }
      REQUIRE(slots.size() == 32);
      REQUIRE(sectors[0].size() == 8);
      REQUIRE(sectors[1].size() == 8);
    }
  };
  check(std::integral_constant<int, 64>{});
  check(std::integral_constant<int, 128>{});
  check(std::integral_constant<int, 256>{});
}

TEST_CASE("emulated tensor-core decode: page sizes up to 512, more group sizes and split counts",
          "[kernels][simt][tc_decode]") {
  // Page sizes of both instances (2: `row`; 32, 48, 128, 512: `tile`, 48 not a power of
  // two), groups 2-16, head dims 64/128/256, splits 1-7 (pieces starting mid-tile and
  // mid-page), every mask.
  const std::uint32_t page_sizes[] = {2, 32, 48, 128, 512};
  const std::uint32_t groups[] = {2, 5, 7, 12, 16};
  const std::uint32_t split_counts[] = {1, 2, 4, 7};
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  for (std::uint32_t index = 0; index < 10; ++index) {
    std::mt19937_64 rng(9000 + index);
    ScenarioConfig c;
    c.options.mask = masks[index % 3];
    c.options.window = std::uniform_int_distribution<std::uint32_t>(1, 200)(rng);
    c.options.chunk = std::uniform_int_distribution<std::uint32_t>(1, 200)(rng);
    c.group = groups[(index * 3) % 5];
    c.tokens_per_page = page_sizes[index % 5];
    c.head_dim = index % 3 == 0 ? 128 : index % 3 == 1 ? 64 : 256;
    c.dtype = index % 4 < 2 ? DType::kBF16 : DType::kF16;
    c.options.soft_cap = index % 3 == 2 ? 2.5f : 0.0f;
    c.kv_heads = c.group >= 8 ? 1 : 2;
    c.batch = 3;
    c.max_kv_len = 600;
    c.nulls = static_cast<NullMode>(index % 3);
    c.seed = 9100 + index;
    Scenario s(c);
    s.fill_host_caches();
    const std::uint32_t splits = split_counts[index % 4];
    INFO("scenario " << index << " mask " << static_cast<int>(c.options.mask) << " group " << c.group << " tpp "
                     << c.tokens_per_page << " d " << c.head_dim << " nulls " << static_cast<int>(c.nulls) << " splits "
                     << splits);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
    for (std::uint64_t seed : {0ull, 3ull}) {  // two lane schedules
      simt::Emulator::get().set_schedule_seed(seed);
      const auto got = tc_paged(s, splits, index % 2 == 0);
      CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
      if (!s.any_null) CHECK(tc_contiguous(s, splits) == got);
    }
    simt::Emulator::get().set_schedule_seed(0);
  }
}

TEST_CASE("emulated tensor-core decode at head dim 64: 64-token warp tiles", "[kernels][simt][tc_decode]") {
  // The launched form at head dim 64 (swapped operands, 4 sub-tiles per warp tile, their page
  // ids spread over the lanes): pages of 16-64 tokens (one entry per sub-tile), 1 and 17 (each
  // row finds its page), null pages, splits 1-7 (pieces starting mid-tile and mid-page),
  // lengths up to 900 (several warp tiles per warp, odd counts for the unrolled loop's tail),
  // every mask, groups 1-8, both dtypes, two lane schedules.
  const std::uint32_t page_sizes[] = {16, 32, 17, 64, 1, 48};
  const std::uint32_t groups[] = {1, 4, 8, 6, 2, 3};
  const std::uint32_t split_counts[] = {1, 2, 3, 5, 7, 4};
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  for (std::uint32_t index = 0; index < 6; ++index) {
    std::mt19937_64 rng(9500 + index);
    ScenarioConfig c;
    c.options.mask = masks[index % 3];
    c.options.window = std::uniform_int_distribution<std::uint32_t>(30, 400)(rng);
    c.options.chunk = std::uniform_int_distribution<std::uint32_t>(30, 400)(rng);
    c.group = groups[index];
    c.tokens_per_page = page_sizes[index];
    c.head_dim = 64;
    c.dtype = index % 2 == 0 ? DType::kBF16 : DType::kF16;
    c.options.soft_cap = index == 3 ? 2.0f : 0.0f;
    c.kv_heads = 2;
    c.batch = 3;
    c.max_kv_len = 900;
    c.nulls = static_cast<NullMode>(index % 3);
    c.seed = 9600 + index;
    Scenario s(c);
    s.fill_host_caches();
    const std::uint32_t splits = split_counts[index];
    INFO("scenario " << index << " mask " << static_cast<int>(c.options.mask) << " group " << c.group << " tpp "
                     << c.tokens_per_page << " nulls " << static_cast<int>(c.nulls) << " splits " << splits);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
    for (std::uint64_t seed : {0ull, 5ull}) {  // two lane schedules
      simt::Emulator::get().set_schedule_seed(seed);
      const auto got = tc_paged(s, splits, index % 2 == 0);
      CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
      if (!s.any_null) CHECK(tc_contiguous(s, splits) == got);
    }
    simt::Emulator::get().set_schedule_seed(0);
  }
}

TEST_CASE("emulated tensor-core decode: rings of 3 and 4 stages give the 2-stage bits", "[kernels][simt][tc_decode]") {
  // The ring's depth changes when a tile is copied, never what is computed or in which
  // order: outputs equal bit for bit, over both instances, null pages, splits and masks.
  const std::uint32_t page_sizes[] = {16, 17, 64, 1};
  for (std::uint32_t index = 0; index < 4; ++index) {
    ScenarioConfig c;
    c.options.mask = index % 2 == 0 ? MaskKind::kCausal : MaskKind::kSlidingWindow;
    c.options.window = 150;
    c.group = index < 2 ? 4 : 16;
    c.tokens_per_page = page_sizes[index];
    c.head_dim = 128;
    c.dtype = index % 2 == 0 ? DType::kBF16 : DType::kF16;
    c.kv_heads = c.group >= 8 ? 1 : 2;
    c.batch = 3;
    c.max_kv_len = 500;
    c.nulls = static_cast<NullMode>(index % 3);
    c.seed = 9300 + index;
    Scenario s(c);
    s.fill_host_caches();
    const std::uint32_t splits = index % 2 == 0 ? 1 : 3;
    INFO("scenario " << index << " tpp " << c.tokens_per_page << " splits " << splits);
    simt::Emulator::get().set_schedule_seed(index);
    // 16-token warp tiles at every depth (the 2-stage default of groups up to 8 takes 32).
    const auto two = tc_paged(s, splits, true, 2, true, false);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
    CHECK(max_rel_error(c.dtype, two, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
    CHECK(tc_paged(s, splits, true, 3) == two);
    CHECK(tc_paged(s, splits, false, 4) == two);
    // The grid with kv heads along x (TcDecodeShape::heads_first): the same CTAs' work.
    CHECK(tc_paged(s, splits, true, 2, true, false, nullptr, true) == two);
  }
  simt::Emulator::get().set_schedule_seed(0);
}

namespace {
// The piece (blockIdx.z) of the CTA that ran last for (request 0, kv head 0) in the latest
// emulated launch: the one that merged.
std::uint32_t last_piece() {
  std::uint32_t z = 0;
  for (const dim3& idx : simt::Emulator::get().block_order())
    if (idx.x == 0 && idx.y == 0) z = idx.z;
  return z;
}
bool all_zero(const std::vector<std::uint32_t>& v) {
  return std::all_of(v.begin(), v.end(), [](std::uint32_t x) { return x == 0; });
}
}  // namespace

TEST_CASE("emulated tensor-core decode: split pieces merged by the last CTA inside the kernel",
          "[kernels][simt][tc_decode]") {
  // Under four CTA orders (the last-arriving piece differs) and two lane schedules: the
  // in-kernel merge gives merge_kernel's bits, within 4 ulp of the CPU reference, with no
  // visibility violation (simt_global.hpp: partials fenced before the arrival, read after
  // the acquire), and leaves every counter zero. Both forms (swapped, 16-row), head dims
  // 64/128/256, two head chunks (group 24), pages of 1-64 tokens, null pages, every mask.
  struct Case {
    std::uint32_t tpp, group, d, splits;
    MaskKind mask;
    DType dtype;
    NullMode nulls;
  };
  const Case cases[] = {
      {16, 4, 128, 3, MaskKind::kCausal, DType::kBF16, NullMode::kNone},
      {17, 8, 64, 5, MaskKind::kSlidingWindow, DType::kF16, NullMode::kRandom},
      {1, 16, 128, 2, MaskKind::kChunkedLocal, DType::kBF16, NullMode::kOutOfWindow},
      {64, 2, 64, 7, MaskKind::kCausal, DType::kF16, NullMode::kRandom},
      {32, 24, 256, 4, MaskKind::kSlidingWindow, DType::kBF16, NullMode::kNone},
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
    c.kv_heads = k.group >= 8 ? 1 : 2;
    c.batch = 3;
    c.max_kv_len = 400;
    c.nulls = k.nulls;
    c.seed = 9800 + index;
    Scenario s(c);
    s.fill_host_caches();
    INFO("case " << index << " tpp " << k.tpp << " group " << k.group << " d " << k.d << " splits " << k.splits);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), k.splits, true));
    const auto separate = tc_paged(s, k.splits, index % 2 == 0);
    std::set<std::uint32_t> mergers;
    for (auto [blocks, lanes] : {std::pair{0ull, 0ull}, {11ull, 7ull}, {12ull, 0ull}, {13ull, 3ull}}) {
      simt::Emulator::get().set_schedule_seed(lanes);
      simt::Emulator::get().set_block_order_seed(blocks);
      simt::GlobalOrder::get().reset_violations();
      std::vector<std::uint32_t> counters(experimental::tc_merge_counters(s.rows, s.q_heads), 0u);
      const auto got = tc_paged(s, k.splits, index % 2 == 0, 2, true, true, counters.data());
      mergers.insert(last_piece());
      CHECK(got == separate);
      CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
      CHECK(simt::GlobalOrder::get().violations() == 0);
      CHECK(all_zero(counters));
      if (!s.any_null) CHECK(tc_contiguous(s, k.splits, counters.data()) == got);
      // kv heads along the grid's x (TcDecodeShape::heads_first): the counters are indexed
      // by (request, kv head x head chunk) either way; the same bits, counters zero again.
      CHECK(tc_paged(s, k.splits, index % 2 == 0, 2, true, true, counters.data(), true) == got);
      CHECK(simt::GlobalOrder::get().violations() == 0);
      CHECK(all_zero(counters));
      if (!s.any_null) CHECK(tc_contiguous(s, k.splits, nullptr, true) == got);
    }
    CHECK(mergers.size() > 1);  // the merging piece moved with the CTA order
  }
  simt::Emulator::get().set_schedule_seed(0);
  simt::Emulator::get().set_block_order_seed(0);
}

TEST_CASE("emulated tensor-core decode: a replay with new lengths on the same counters gives the eager bits",
          "[kernels][simt][tc_decode]") {
  // A captured launch is replayed with the same arguments and new contents: the counters
  // the first launch left are the next one's start. Shorter lengths on the same tables,
  // another CTA order: the replay equals an eager launch on fresh counters, the separate
  // merge, and the CPU reference.
  ScenarioConfig c;
  c.options.mask = MaskKind::kCausal;
  c.group = 4;
  c.tokens_per_page = 16;
  c.head_dim = 128;
  c.kv_heads = 2;
  c.batch = 4;
  c.max_kv_len = 500;
  c.seed = 9900;
  Scenario s(c);
  s.fill_host_caches();
  const std::uint32_t splits = 4;
  std::vector<std::uint32_t> counters(experimental::tc_merge_counters(s.rows, s.q_heads), 0u);
  simt::Emulator::get().set_block_order_seed(21);
  (void)tc_paged(s, splits, true, 2, true, true, counters.data());
  REQUIRE(all_zero(counters));
  for (std::uint32_t b = 0; b < c.batch; ++b) s.kv_lens[b] = std::max(1u, s.kv_lens[b] * 2 / 3 - 7 * b);
  simt::Emulator::get().set_block_order_seed(22);
  const auto replay = tc_paged(s, splits, true, 2, true, true, counters.data());
  CHECK(all_zero(counters));
  simt::Emulator::get().set_block_order_seed(0);
  std::vector<std::uint32_t> fresh(counters.size(), 0u);
  CHECK(tc_paged(s, splits, true, 2, true, true, fresh.data()) == replay);
  CHECK(tc_paged(s, splits, true) == replay);
  std::vector<std::uint16_t> ref(s.out_elems());
  cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
  CHECK(max_rel_error(c.dtype, replay, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
}

TEST_CASE("emulated tensor-core decode on head-major caches equals token-major", "[kernels][simt][tc_decode][hnd]") {
  for (const HndCase& h : hnd_cases(false)) {
    const ScenarioConfig& c = h.cfg;
    OrderPair s(c);
    INFO(h.describe());
    REQUIRE(s.arenas_differ());
    std::vector<std::uint16_t> ref(s.hnd.out_elems());
    cpu::paged_decode_attention(s.hnd.paged_params(ref.data(), h.splits, true));
    const auto got = tc_paged(s.hnd, h.splits, c.csr);  // the launcher's instance (swapped where it runs)
    CHECK(got == tc_paged(s.nhd, h.splits, c.csr));
    CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
    if (!s.hnd.any_null) CHECK(tc_contiguous(s.hnd, h.splits) == got);
    if (c.group <= 8 && c.head_dim <= 128)  // the 16-row form and 16-token swapped tiles too
      for (auto [swap, tile32] : {std::pair{false, true}, std::pair{true, false}})
        CHECK(tc_paged(s.hnd, h.splits, c.csr, 2, swap, tile32) == tc_paged(s.nhd, h.splits, c.csr, 2, swap, tile32));
  }
}

TEST_CASE("the tensor-core decode's launchers reject shapes they do not build", "[kernels][tc_decode]") {
  // The limiter probes (TcDecodeShape::probe): 0 always, 1-3 where the launch is one they are
  // built for, nothing else.
  experimental::check_tc_probe("k", {}, false);
  experimental::check_tc_probe("k", {0, false, 3}, true);
  for (const auto& [probe, runs] : {std::pair{1u, false}, std::pair{3u, false}, std::pair{4u, true}}) {
    INFO("probe " << probe << " runs " << runs);
    try {
      experimental::check_tc_probe("paged_decode_attention_tc", {0, false, probe}, runs);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("paged_decode_attention_tc: shape.probe = " + std::to_string(probe)) !=
            std::string::npos);
    }
  }
  experimental::check_tc_shape("k", {}, 1, 8);
  experimental::check_tc_shape("k", {16, true}, 65535, 8);
  experimental::check_tc_shape("k", {0, false}, 100000, 8);
  for (std::uint32_t t : {1u, 8u, 32u, 64u}) {
    INFO("tile_tokens " << t);
    try {
      experimental::check_tc_shape("paged_decode_attention_tc", {t, false}, 1, 8);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("paged_decode_attention_tc: shape.tile_tokens = " + std::to_string(t)) !=
            std::string::npos);
    }
  }
  try {
    experimental::check_tc_shape("contiguous_decode_attention_tc", {0, true}, 70000, 8);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("rows = 70000") != std::string::npos);
  }
}

TEST_CASE("the tensor-core decode's launchers reject ring depths they do not build", "[kernels][tc_decode]") {
  for (std::uint32_t d : {64u, 128u, 256u}) experimental::check_tc_stages("k", 2, d);
  experimental::check_tc_stages("k", 3, 128);
  experimental::check_tc_stages("k", 4, 128);
  for (auto [stages, d] : {std::pair{0u, 128u}, {1u, 128u}, {5u, 128u}, {3u, 64u}, {4u, 256u}}) {
    INFO("stages " << stages << " head_dim " << d);
    try {
      experimental::check_tc_stages("paged_decode_attention_tc", stages, d);
      FAIL("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find("paged_decode_attention_tc: stages = " + std::to_string(stages)) != std::string::npos);
      CHECK(what.find("head_dim " + std::to_string(d)) != std::string::npos);
    }
  }
}

#endif
