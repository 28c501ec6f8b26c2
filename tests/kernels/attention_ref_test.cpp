// The CPU attention references against a naive dense attention: every mask, GQA ratios
// 1/4/8, page sizes 1/16/17, permuted and over-allocated tables (CSR and dense), null
// pages, split-KV, soft-capping, both dtypes and head dims, token- and head-major caches;
// and paged == contiguous.
#include "kernels/kernel_fixture.hpp"

#include <catch2/catch.hpp>

#include <kvmm/error.hpp>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;

namespace {

AttentionOptions mask_options(MaskKind kind, std::mt19937_64& rng) {
  AttentionOptions o;
  o.mask = kind;
  if (kind == MaskKind::kSlidingWindow) o.window = std::uniform_int_distribution<std::uint32_t>(1, 40)(rng);
  if (kind == MaskKind::kChunkedLocal) o.chunk = std::uniform_int_distribution<std::uint32_t>(1, 40)(rng);
  return o;
}

const char* mask_name(MaskKind k) {
  return k == MaskKind::kCausal ? "causal" : k == MaskKind::kSlidingWindow ? "sliding" : "chunked";
}

}  // namespace

TEST_CASE("attention references match naive dense attention", "[kernels][attention]") {
  const MaskKind masks[] = {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal};
  const std::uint32_t groups[] = {1, 4, 8};
  const std::uint32_t page_sizes[] = {1, 16, 17};
  const std::uint32_t dims[] = {64, 128, 256};
  std::uint32_t index = 0;
  std::uint32_t compared = 0;
  for (MaskKind mask : masks)
    for (std::uint32_t group : groups)
      for (std::uint32_t tpp : page_sizes)
        for (bool prefill : {false, true}) {
          // The less central axes cycle with the scenario index so that every value of
          // each meets every mask, group and page size.
          ++index;
          std::mt19937_64 rng(1000 + index);
          ScenarioConfig c;
          c.options = mask_options(mask, rng);
          c.group = group;
          c.tokens_per_page = tpp;
          c.prefill = prefill;
          c.head_dim = dims[index % 3];
          c.dtype = index % 2 ? DType::kBF16 : DType::kF16;
          c.options.soft_cap = index % 4 == 1 ? 1.5f : 0.0f;
          if (index % 5 == 2) c.options.scale = 0.3f;
          c.csr = index % 2 == 0;
          c.nulls = static_cast<NullMode>(index % 3);
          c.kv_heads = group == 8 ? 1 : 2;
          c.max_kv_len = c.head_dim == 256 ? 50 : 75;
          c.seed = index;
          c.order = (index / 3) % 2 == 0 ? KVOrder::kTokenMajor : KVOrder::kHeadMajor;
          Scenario s(c);
          s.fill_host_caches();
          const std::vector<double> want = s.naive();
          INFO("scenario " << index << " mask " << mask_name(mask) << " window " << c.options.window << " chunk "
                           << c.options.chunk << " group " << group << " tpp " << tpp << " prefill " << prefill << " d "
                           << c.head_dim << " bf16 " << (c.dtype == DType::kBF16) << " cap " << c.options.soft_cap
                           << " csr " << c.csr << " nulls " << static_cast<int>(c.nulls) << " head-major "
                           << (c.order == KVOrder::kHeadMajor));
          const double bound = unit_roundoff(c.dtype) * 1.01;
          std::vector<std::uint16_t> paged_out, cont_out;
          for (std::uint32_t splits : {1u, 3u, 8u}) {
            INFO("splits " << splits);
            std::vector<std::uint16_t> o(s.out_elems(), 0xffff);
            auto pp = s.paged_params(o.data(), splits, c.csr);
            if (prefill)
              cpu::paged_prefill_attention(pp);
            else
              cpu::paged_decode_attention(pp);
            CHECK(max_rel_error(c.dtype, o, want, 1e-4) <= bound);
            // The other table format gives bit-identical results.
            std::vector<std::uint16_t> o2(s.out_elems(), 0xffff);
            auto pp2 = s.paged_params(o2.data(), splits, !c.csr);
            if (prefill)
              cpu::paged_prefill_attention(pp2);
            else
              cpu::paged_decode_attention(pp2);
            CHECK(o2 == o);
            if (!s.any_null) {
              std::vector<std::uint16_t> oc(s.out_elems(), 0xffff);
              auto cp = s.contiguous_params(oc.data(), splits);
              if (prefill)
                cpu::contiguous_prefill_attention(cp);
              else
                cpu::contiguous_decode_attention(cp);
              CHECK(oc == o);  // same data, same order of operations: paged == contiguous exactly
              ++compared;
            }
          }
        }
  CHECK(compared >= 40);  // the paged == contiguous check really ran in many scenarios
}

TEST_CASE("sliding-window null pages change nothing", "[kernels][attention]") {
  // Freeing out-of-window pages (replacing them with the null page) must not change the
  // output: the window never reached them.
  for (std::uint32_t tpp : {1u, 16u, 17u}) {
    ScenarioConfig c;
    c.options.mask = MaskKind::kSlidingWindow;
    c.options.window = 20;
    c.tokens_per_page = tpp;
    c.max_kv_len = 120;
    c.batch = 4;
    c.seed = 77 + tpp;
    c.nulls = NullMode::kNone;
    Scenario full(c);
    full.fill_host_caches();
    c.nulls = NullMode::kOutOfWindow;
    Scenario sparse(c);
    sparse.fill_host_caches();
    REQUIRE(sparse.any_null);
    std::vector<std::uint16_t> a(full.out_elems()), b(sparse.out_elems());
    cpu::paged_decode_attention(full.paged_params(a.data(), 2, true));
    cpu::paged_decode_attention(sparse.paged_params(b.data(), 2, true));
    CHECK(a == b);
  }
}

TEST_CASE("a query with no visible key writes zeros", "[kernels][attention]") {
  ScenarioConfig c;
  c.tokens_per_page = 4;
  c.batch = 1;
  c.max_kv_len = 1;  // kv_len is 1: the only key lives in page 0
  c.seed = 5;
  Scenario s(c);
  s.rows_pages[0][0] = kNullPage;  // then free it
  s.csr_indices[0] = kNullPage;
  s.fill_host_caches();
  std::vector<std::uint16_t> o(s.out_elems(), 0x3c00);
  cpu::paged_decode_attention(s.paged_params(o.data(), 1, true));
  for (std::uint16_t x : o) CHECK(to_float(DType::kF16, x) == 0.0f);
}

TEST_CASE("key ranges and split pieces", "[kernels][attention]") {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 20000; ++iter) {
    AttentionOptions o = mask_options(static_cast<MaskKind>(iter % 3), rng);
    const std::uint32_t q_pos = std::uniform_int_distribution<std::uint32_t>(0, 300)(rng);
    const KeyRange r = key_range(o.mask, o.window, o.chunk, q_pos);
    // The range is exactly the visible keys.
    for (std::uint32_t k = 0; k <= q_pos + 1; ++k) REQUIRE(visible(o, q_pos, k) == (k >= r.lo && k < r.hi));
    const std::uint32_t n = std::uniform_int_distribution<std::uint32_t>(1, 40)(rng);
    std::uint32_t next = r.lo;
    for (std::uint32_t s = 0; s < n; ++s) {
      const KeyRange piece = split_range(r, s, n);
      REQUIRE(piece.lo <= piece.hi);
      if (piece.lo == piece.hi) continue;
      REQUIRE(piece.lo == next);  // pieces are ordered, disjoint and cover the range
      next = piece.hi;
    }
    REQUIRE(next == r.hi);
  }
}

TEST_CASE("choose_num_splits fills the GPU only when the batch does not", "[kernels][attention]") {
  CHECK(choose_num_splits(256, 32, 8, 4096, 132) == 1);      // 2048 CTAs already
  CHECK(choose_num_splits(1, 32, 8, 32768, 132) == 33);      // 8 CTAs -> 264 / 8
  CHECK(choose_num_splits(1, 32, 8, 1000, 132) == 3);        // capped by 256 keys per split
  CHECK(choose_num_splits(2, 64, 4, 100000, 100, 2) == 13);  // group 16 -> 2 head chunks, 16 CTAs
  CHECK(attention_workspace_bytes(4, 8, 128, 1) == 0);
  CHECK(attention_workspace_bytes(4, 8, 128, 3) == 4u * 8 * 3 * (128 + 1) * sizeof(float));
  CHECK_THROWS_WITH(choose_num_splits(1, 6, 4, 10, 10), Catch::Contains("q_heads = 6"));
}

TEST_CASE("attention misuse raises kvmm::Error naming the field and writes nothing", "[kernels][attention]") {
  ScenarioConfig c;
  c.seed = 9;
  Scenario s(c);
  s.fill_host_caches();
  std::vector<std::uint16_t> o(s.out_elems(), 0x1234);
  const std::vector<std::uint16_t> before = o;
  auto expect = [&](PagedAttentionParams p, const char* what) {
    CHECK_THROWS_WITH(cpu::paged_decode_attention(p), Catch::Contains(what));
    CHECK(o == before);
  };
  auto p = s.paged_params(o.data(), 1, true);
  {
    auto q = p;
    q.cache.head_dim = 96;
    expect(q, "cache.head_dim = 96");
  }
  {
    auto q = p;
    q.query.q_heads = 3;
    expect(q, "query.q_heads = 3");
  }
  {
    auto q = p;
    q.cache.page_stride_bytes = 64;
    expect(q, "cache.page_stride_bytes = 64");
  }
  {
    auto q = p;
    q.cache.page_stride_bytes += 8;
    expect(q, "must be a multiple of 16");
  }
  {
    auto q = p;
    q.cache.tokens_per_page = 0;
    expect(q, "cache.tokens_per_page = 0");
  }
  {
    auto q = p;
    q.options.mask = MaskKind::kSlidingWindow;
    expect(q, "options.window = 0");
  }
  {
    auto q = p;
    q.options.mask = MaskKind::kChunkedLocal;
    expect(q, "options.chunk = 0");
  }
  {
    auto q = p;
    q.options.soft_cap = -1.0f;
    expect(q, "options.soft_cap = -1");
  }
  {
    auto q = p;
    q.split.num_splits = 0;
    expect(q, "split.num_splits = 0");
  }
  {
    auto q = p;
    q.query.q_indptr = s.q_indptr.data();
    expect(q, "query.q_indptr");
  }
  {
    auto q = p;
    q.cache.k = static_cast<char*>(q.cache.k) + 2;
    expect(q, "cache.k");
  }
  {
    auto q = p;
    q.table = PageTableView{nullptr, s.dense.data(), 0};
    expect(q, "table.dense_stride = 0");
  }
  {
    // A context longer than its page table row: caught by the reference before any write.
    auto lens = s.kv_lens;
    lens[1] = static_cast<std::uint32_t>((s.csr_indptr[2] - s.csr_indptr[1]) * c.tokens_per_page + 1);
    auto q = p;
    q.query.kv_lens = lens.data();
    expect(q, "query.kv_lens[1]");
  }
  {
    std::vector<std::uint16_t> oc(s.out_elems(), 0x1234);
    auto cp = s.contiguous_params(oc.data(), 1);
    auto lens = s.kv_lens;
    lens[0] = s.max_ctx + 1;
    cp.query.kv_lens = lens.data();
    CHECK_THROWS_WITH(cpu::contiguous_decode_attention(cp), Catch::Contains("larger than cache.max_ctx"));
    cp = s.contiguous_params(oc.data(), 1);
    cp.slot_idx = nullptr;
    CHECK_THROWS_WITH(cpu::contiguous_decode_attention(cp), Catch::Contains("slot_idx = nullptr"));
    CHECK(oc == before);
  }
}

TEST_CASE("launch-only and cache-op checks name the field", "[kernels][attention]") {
  ScenarioConfig c;
  c.seed = 10;
  Scenario s(c);
  std::vector<std::uint16_t> o(s.out_elems());
  auto p = s.paged_params(o.data(), 2, true);
  CHECK_NOTHROW(check_params(p, false, false));  // the references need no workspace
  CHECK_THROWS_WITH(check_params(p, false, true), Catch::Contains("split.workspace = nullptr"));
  p.split.num_splits = 2000;
  CHECK_THROWS_WITH(check_params(p, false, false), Catch::Contains("split.num_splits = 2000"));
  auto cp = s.contiguous_params(o.data(), 1);
  cp.cache.slot_stride_bytes = 16;
  CHECK_THROWS_WITH(check_params(cp, false, true), Catch::Contains("cache.slot_stride_bytes = 16"));
  cp = s.contiguous_params(o.data(), 1);
  CHECK_THROWS_WITH(check_params(cp, true, true), Catch::Contains("query.q_indptr = nullptr"));
  PagedWriteParams w{s.paged_cache(s.arena.data()), nullptr, nullptr, nullptr, nullptr, 1};
  CHECK_THROWS_WITH(check_params(w), Catch::Contains("k_new = nullptr"));
  w.num_tokens = 0;
  CHECK_NOTHROW(check_params(w));  // nothing to write
  PageCopyParams cpy{s.arena.data(), s.arena.data(), 64, 64, 128, s.csr_indices.data(), s.csr_indices.data(), 1};
  CHECK_THROWS_WITH(check_params(cpy), Catch::Contains("page_bytes = 128"));
  cpy.src_pages = nullptr;
  CHECK_THROWS_WITH(check_params(cpy), Catch::Contains("src_pages = nullptr"));
  // An order outside KVOrder, in every cache a check reads.
  p = s.paged_params(o.data(), 1, true);
  p.cache.order = static_cast<KVOrder>(7);
  CHECK_THROWS_WITH(check_params(p, false, false), Catch::Contains("cache.order = 7"));
  cp = s.contiguous_params(o.data(), 1);
  cp.cache.order = static_cast<KVOrder>(2);
  CHECK_THROWS_WITH(check_params(cp, false, false), Catch::Contains("cache.order = 2"));
  w.cache.order = static_cast<KVOrder>(255);
  CHECK_THROWS_WITH(check_params(w), Catch::Contains("cache.order = 255"));
  // A head-major head of 2^32 bytes or more (the kernels' 32-bit head stride).
  cp = s.contiguous_params(o.data(), 1);
  cp.cache.order = KVOrder::kHeadMajor;
  cp.cache.max_ctx = 1u << 25;  // x 64 dims x 2 bytes = 2^32
  cp.cache.slot_stride_bytes = std::uint64_t{cp.cache.max_ctx} * s.row_bytes();
  CHECK_THROWS_WITH(check_params(cp, false, false), Catch::Contains("cache.max_ctx = 33554432"));
  cp.cache.order = KVOrder::kTokenMajor;  // token-major: a head's stride is head_dim x 2
  CHECK_NOTHROW(check_params(cp, false, false));
}
