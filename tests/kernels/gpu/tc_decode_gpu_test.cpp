// The tensor-core decode (kernels/tc_decode.cuh) on a GPU: against the CPU references on
// random inputs with NaN-poisoned outputs (masks, GQA 1/4/8/16, page sizes 1/16/17/64,
// null pages, CSR and dense tables, splits, soft cap, both dtypes, D 64/128), the
// contiguous form equal to the paged one bit for bit, split pieces merged by the last CTA
// inside the kernel equal to the separate merge bit for bit, and a launch captured in a
// CUDA graph (both merges) replayed with new context lengths equal to an eager launch bit
// for bit, the in-kernel merge's counters left zero; head-major caches (KVOrder) filled by
// the GPU's write_kv equal to the CPU's, and read by the tensor-core and default decode with
// the token-major bits; heads across warps (TcDecodeShape::warp_heads) against the same
// references, both merges and grid orders, kv heads not a multiple of 4, and the shapes it
// refuses. Part of
// kvmm_test_gpu (skipped without a device); the same checks run through the emulator in
// tests/kernels/tc_decode_test.cpp.
#include "../../../kernels/tc_decode_api.hpp"
#include "kernels/hnd_util.hpp"
#include "kernels/kernel_fixture.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

#include <cuda_runtime.h>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;

namespace {

#define TC_CUDA_OK(x) REQUIRE((x) == cudaSuccess)

struct Dev {
  void* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t bytes) : n(std::max<std::size_t>(bytes, 16)) { TC_CUDA_OK(cudaMalloc(&p, n)); }
  template <typename T>
  explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
    TC_CUDA_OK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> get(std::size_t count) const {
    std::vector<T> out(count);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    TC_CUDA_OK(cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

// A decode scenario's inputs on the device (caches copied from the host-filled ones).
struct TcDevice {
  Scenario& s;
  Dev q, lens, indptr, indices, dense, slots, arena, ck, cv, out, ws, counters;
  explicit TcDevice(Scenario& sc)
      : s(sc),
        q(sc.q),
        lens(sc.kv_lens),
        indptr(sc.csr_indptr),
        indices(sc.csr_indices),
        dense(sc.dense),
        slots(sc.slot_idx),
        arena(sc.arena.blocks),
        ck(sc.cont_k.blocks),
        cv(sc.cont_v.blocks),
        out(sc.out_elems() * 2),
        ws(attention_workspace_bytes(sc.rows, sc.q_heads, sc.cfg.head_dim, 64)),
        counters(experimental::tc_merge_counters(sc.rows, sc.q_heads) * 4) {
    TC_CUDA_OK(cudaMemset(counters.p, 0, counters.n));  // once: every launch leaves them zero
  }
  PagedAttentionParams paged(std::uint32_t splits, bool csr) {
    PagedAttentionParams p;
    p.query = s.query(q.p, out.p, lens.as<std::uint32_t>(), nullptr);
    p.cache = s.paged_cache(arena.p);
    p.table = csr ? PageTableView{indptr.as<std::uint32_t>(), indices.as<PageId>(), 0}
                  : PageTableView{nullptr, dense.as<PageId>(), s.dense_stride};
    p.options = s.cfg.options;
    p.split = SplitKV{splits, ws.p};
    return p;
  }
  // in_kernel: the last CTA of each (request, kv head) merges the split pieces; shape: the
  // warp tiles and grid order (TcDecodeShape).
  std::vector<std::uint16_t> run_paged(std::uint32_t splits, bool csr, cudaStream_t st = nullptr,
                                       std::uint32_t stages = 2, bool in_kernel = false,
                                       experimental::TcDecodeShape shape = {}) {
    TC_CUDA_OK(cudaMemset(out.p, 0xff, out.n));
    experimental::paged_decode_attention_tc(paged(splits, csr), st, stages,
                                            in_kernel ? counters.as<std::uint32_t>() : nullptr, shape);
    return out.get<std::uint16_t>(s.out_elems());
  }
  std::vector<std::uint16_t> run_contiguous(std::uint32_t splits, experimental::TcDecodeShape shape = {},
                                            bool in_kernel = false) {
    TC_CUDA_OK(cudaMemset(out.p, 0xff, out.n));
    ContiguousAttentionParams p;
    p.query = s.query(q.p, out.p, lens.as<std::uint32_t>(), nullptr);
    p.cache = s.contiguous_cache(ck.p, cv.p);
    p.slot_idx = slots.as<std::uint32_t>();
    p.options = s.cfg.options;
    p.split = SplitKV{splits, ws.p};
    experimental::contiguous_decode_attention_tc(p, nullptr, 2, in_kernel ? counters.as<std::uint32_t>() : nullptr,
                                                 shape);
    return out.get<std::uint16_t>(s.out_elems());
  }
};

}  // namespace

TEST_CASE("tensor-core decode matches the CPU references on the GPU", "[gpu][attention][tc_decode]") {
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  std::uint32_t index = 0;
  for (MaskKind mask : masks)
    for (std::uint32_t group : {1u, 4u, 8u, 16u})
      for (std::uint32_t tpp : {1u, 16u, 17u, 64u}) {
        ++index;
        std::mt19937_64 rng(8000 + index);
        ScenarioConfig c;
        c.options.mask = mask;
        c.options.window = std::uniform_int_distribution<std::uint32_t>(1, 300)(rng);
        c.options.chunk = std::uniform_int_distribution<std::uint32_t>(1, 300)(rng);
        c.group = group;
        c.tokens_per_page = tpp;
        c.head_dim = index % 3 == 0 ? 64 : 128;
        c.dtype = index % 4 < 2 ? DType::kBF16 : DType::kF16;
        c.options.soft_cap = index % 5 == 1 ? 1.5f : 0.0f;
        c.kv_heads = group >= 8 ? 1 : 2;
        c.batch = 5;
        c.max_kv_len = 700;
        c.nulls = static_cast<NullMode>(index % 3);
        c.seed = 8100 + index;
        Scenario s(c);
        s.fill_host_caches();
        TcDevice d(s);
        const std::uint32_t splits = index % 3 == 1 ? 4 : 1;
        INFO("scenario " << index << " group " << group << " tpp " << tpp << " d " << c.head_dim);
        std::vector<std::uint16_t> ref(s.out_elems());
        cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
        const auto got = d.run_paged(splits, index % 2 == 0);
        CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
        if (!s.any_null) CHECK(d.run_contiguous(splits) == got);
        if (splits > 1) {
          CHECK(d.run_paged(splits, index % 2 == 0, nullptr, 2, true) == got);
          const auto counters = d.counters.get<std::uint32_t>(experimental::tc_merge_counters(s.rows, s.q_heads));
          CHECK(std::all_of(counters.begin(), counters.end(), [](std::uint32_t x) { return x == 0; }));
        }
        // The CTA shapes (TcDecodeShape): the grid with kv heads along x gives the same bits;
        // 16-token warp tiles (another summation order where groups <= 8 take 32 or 64) the
        // same bound, and with both the 16-token bits, the split merge in the kernel too.
        CHECK(d.run_paged(splits, index % 2 == 0, nullptr, 2, false, {0, true}) == got);
        const auto t16 = d.run_paged(splits, index % 2 == 0, nullptr, 2, false, {16, false});
        CHECK(max_rel_error(c.dtype, t16, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
        if (group > 8) CHECK(t16 == got);
        CHECK(d.run_paged(splits, index % 2 == 0, nullptr, 2, splits > 1, {16, true}) == t16);
        // The old plain lane map probe (TcDecodeShape::probe 3, issue 36): the default's bits where
        // it runs (bf16, head dim 128, groups of at most 8, pages of 16-token multiples).
        if (c.dtype == DType::kBF16 && c.head_dim == 128 && group <= 8 && tpp % 16 == 0)
          CHECK(d.run_paged(splits, index % 2 == 0, nullptr, 2, false, {0, false, 3}) == got);
      }
}

TEST_CASE("tensor-core decode on the GPU: head dim 256, rings of 3 and 4 stages, bad stage counts",
          "[gpu][attention][tc_decode]") {
  for (std::uint32_t index = 0; index < 6; ++index) {
    ScenarioConfig c;
    c.options.mask = index % 2 == 0 ? MaskKind::kCausal : MaskKind::kSlidingWindow;
    c.options.window = 200;
    c.group = index < 3 ? 4 : 16;
    c.tokens_per_page = index % 3 == 0 ? 16 : index % 3 == 1 ? 17 : 128;
    c.head_dim = index < 4 ? 128 : 256;
    c.dtype = index % 2 == 0 ? DType::kBF16 : DType::kF16;
    c.kv_heads = c.group >= 8 ? 1 : 2;
    c.batch = 5;
    c.max_kv_len = 700;
    c.nulls = static_cast<NullMode>(index % 3);
    c.seed = 8500 + index;
    Scenario s(c);
    s.fill_host_caches();
    TcDevice d(s);
    const std::uint32_t splits = index % 2 == 0 ? 1 : 4;
    INFO("scenario " << index << " tpp " << c.tokens_per_page << " d " << c.head_dim);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
    const auto two = d.run_paged(splits, true);
    CHECK(max_rel_error(c.dtype, two, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
    if (c.head_dim == 128) {
      // Groups of at most 8 take 32-token warp tiles at 2 stages and 16-token ones at 3 and
      // 4 (tc_sub), another summation order: the same bound, bit-equal only for group 16.
      const auto three = d.run_paged(splits, true, nullptr, 3);
      const auto four = d.run_paged(splits, false, nullptr, 4);
      CHECK(max_rel_error(c.dtype, three, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
      CHECK(max_rel_error(c.dtype, four, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
      CHECK(three == four);
      if (c.group > 8) CHECK(three == two);
      CHECK(d.run_paged(splits, true, nullptr, 2, false, {16, false}) == three);  // 16-token tiles at 2 stages
    } else {
      CHECK_THROWS_AS(d.run_paged(splits, true, nullptr, 3), Error);
    }
    CHECK_THROWS_AS(d.run_paged(splits, true, nullptr, 5), Error);
    CHECK_THROWS_AS(d.run_paged(splits, true, nullptr, 1), Error);
  }
}

TEST_CASE("a captured tensor-core decode replays with new lengths as an eager launch", "[gpu][attention][tc_decode]") {
  for (bool in_kernel : {false, true}) {
    INFO("in-kernel merge " << in_kernel);
    ScenarioConfig c;
    c.dtype = DType::kBF16;
    c.head_dim = 128;
    c.group = 4;
    c.tokens_per_page = 16;
    c.batch = 4;
    c.max_kv_len = 900;
    c.seed = 77;
    Scenario s(c);
    s.fill_host_caches();
    TcDevice d(s);
    cudaStream_t st;
    TC_CUDA_OK(cudaStreamCreate(&st));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    TC_CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    experimental::paged_decode_attention_tc(d.paged(4, true), st, 2,
                                            in_kernel ? d.counters.as<std::uint32_t>() : nullptr);
    TC_CUDA_OK(cudaStreamEndCapture(st, &graph));
    TC_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<std::uint32_t> lens = s.kv_lens;
    for (int step = 0; step < 3; ++step) {
      for (auto& l : lens) l = l > 37 ? l - 37 : l;  // shorter contexts, same tables
      TC_CUDA_OK(cudaMemcpy(d.lens.p, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
      TC_CUDA_OK(cudaMemset(d.out.p, 0xff, d.out.n));
      TC_CUDA_OK(cudaGraphLaunch(exec, st));
      TC_CUDA_OK(cudaStreamSynchronize(st));
      const auto replayed = d.out.get<std::uint16_t>(s.out_elems());
      const auto eager = d.run_paged(4, true, nullptr, 2, in_kernel);
      CHECK(replayed == eager);
      CHECK(d.run_paged(4, true) == replayed);  // the separate merge's bits
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
}

TEST_CASE("head-major caches on the GPU: write_kv's positions, the decodes' token-major bits",
          "[gpu][attention][tc_decode][hnd]") {
  for (const HndCase& h : hnd_cases(false)) {
    const ScenarioConfig& c = h.cfg;
    OrderPair s(c);
    INFO(h.describe());
    TcDevice hnd(s.hnd), nhd(s.nhd);
    // The GPU's write_kv into a poisoned arena: the CPU's head-major bytes.
    {
      const Scenario::Writes w = s.hnd.writes();
      const auto n = static_cast<std::uint32_t>(w.page_ids.size());
      Dev arena(s.hnd.arena.size()), kn(w.k), vn(w.v), ids(w.page_ids), offs(w.offsets);
      TC_CUDA_OK(cudaMemset(arena.p, 0x7b, arena.n));
      write_kv(PagedWriteParams{s.hnd.paged_cache(arena.p), kn.p, vn.p, ids.as<PageId>(), offs.as<std::uint32_t>(), n},
               nullptr);
      const auto bytes = arena.get<unsigned char>(s.hnd.arena.size());
      CHECK(std::memcmp(bytes.data(), s.hnd.arena.blocks.data(), bytes.size()) == 0);
    }
    std::vector<std::uint16_t> ref(s.hnd.out_elems());
    cpu::paged_decode_attention(s.hnd.paged_params(ref.data(), h.splits, true));
    const auto got = hnd.run_paged(h.splits, c.csr);
    CHECK(got == nhd.run_paged(h.splits, c.csr));
    CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
    if (!s.hnd.any_null) CHECK(hnd.run_contiguous(h.splits) == got);
    // The default decode kernel on the same caches.
    auto old = [&](TcDevice& d) {
      TC_CUDA_OK(cudaMemset(d.out.p, 0xff, d.out.n));
      paged_decode_attention(d.paged(h.splits, c.csr), nullptr);
      return d.out.get<std::uint16_t>(d.s.out_elems());
    };
    CHECK(old(hnd) == old(nhd));
  }
}

TEST_CASE("tensor-core decode with heads across warps on the GPU", "[gpu][attention][tc_decode]") {
  // TcDecodeShape::warp_heads: one CTA per (request, 4 kv heads, piece). Against the CPU
  // reference with NaN-poisoned outputs over kv heads 4/8/6/12 (6: the second CTA's last two
  // warps idle), groups 1-8, D 64/128, pages of 1/16/17/64 tokens, null pages, splits 1/4/7;
  // the in-kernel merge equal to the separate one bit for bit (counters zero after), both
  // grid orders the same bits, contiguous = paged; shapes it does not build raise.
  const std::uint32_t kv_heads[] = {4, 8, 6, 12};
  const std::uint32_t groups[] = {1, 4, 8, 3, 5, 2, 7, 4};
  const std::uint32_t page_sizes[] = {16, 17, 1, 64};
  const std::uint32_t split_counts[] = {1, 4, 7};
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  for (std::uint32_t index = 0; index < 8; ++index) {
    std::mt19937_64 rng(8700 + index);
    ScenarioConfig c;
    c.options.mask = masks[index % 3];
    c.options.window = std::uniform_int_distribution<std::uint32_t>(30, 400)(rng);
    c.options.chunk = std::uniform_int_distribution<std::uint32_t>(30, 400)(rng);
    c.options.soft_cap = index == 5 ? 1.5f : 0.0f;
    c.group = groups[index];
    c.tokens_per_page = page_sizes[index % 4];
    c.head_dim = index % 2 == 0 ? 128 : 64;
    c.dtype = index % 4 < 2 ? DType::kBF16 : DType::kF16;
    c.kv_heads = kv_heads[index % 4];
    c.batch = 5;
    c.max_kv_len = 700;
    c.nulls = static_cast<NullMode>(index % 3);
    c.seed = 8800 + index;
    Scenario s(c);
    s.fill_host_caches();
    TcDevice d(s);
    const std::uint32_t splits = split_counts[index % 3];
    INFO("scenario " << index << " kv_heads " << c.kv_heads << " group " << c.group << " tpp " << c.tokens_per_page
                     << " d " << c.head_dim << " splits " << splits);
    std::vector<std::uint16_t> ref(s.out_elems());
    cpu::paged_decode_attention(s.paged_params(ref.data(), splits, true));
    experimental::TcDecodeShape hw;
    hw.warp_heads = true;
    const auto got = d.run_paged(splits, index % 2 == 0, nullptr, 2, false, hw);
    CHECK(max_rel_error(c.dtype, got, widen(c.dtype, ref), 1e-2) <= 4.0 * unit_roundoff(c.dtype));
    if (!s.any_null) CHECK(d.run_contiguous(splits, hw) == got);
    experimental::TcDecodeShape hf = hw;
    hf.heads_first = true;
    CHECK(d.run_paged(splits, index % 2 != 0, nullptr, 2, false, hf) == got);
    if (splits > 1) {
      CHECK(d.run_paged(splits, index % 2 == 0, nullptr, 2, true, hw) == got);
      CHECK(d.run_paged(splits, index % 2 == 0, nullptr, 2, true, hf) == got);
      if (!s.any_null) CHECK(d.run_contiguous(splits, hf, true) == got);
      const auto counters = d.counters.get<std::uint32_t>(experimental::tc_merge_counters(s.rows, s.q_heads));
      CHECK(std::all_of(counters.begin(), counters.end(), [](std::uint32_t x) { return x == 0; }));
    }
    // Shapes heads across warps does not build: 3 stages, 16-token tiles, a probe.
    CHECK_THROWS_AS(d.run_paged(splits, true, nullptr, 3, false, hw), Error);
    experimental::TcDecodeShape t16 = hw;
    t16.tile_tokens = 16;
    CHECK_THROWS_AS(d.run_paged(splits, true, nullptr, 2, false, t16), Error);
  }
  // Groups over 8 (the 16-row form) are refused too.
  ScenarioConfig c;
  c.group = 16;
  c.kv_heads = 1;
  c.head_dim = 128;
  Scenario s(c);
  s.fill_host_caches();
  TcDevice d(s);
  experimental::TcDecodeShape hw;
  hw.warp_heads = true;
  CHECK_THROWS_AS(d.run_paged(1, true, nullptr, 2, false, hw), Error);
}
