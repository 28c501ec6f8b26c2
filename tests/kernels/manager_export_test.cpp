// The KVCacheManager's exports read back as FlashInfer reads them (issue 15): every step,
// each group's rows go out as int32 CSR with the reserved zero page in place of freed
// pages; the kv length of each row is rebuilt from the export alone,
// (pages - 1) * tokens_per_page + last_page_len, and the CPU reference kernels attend
// through those pages and lengths. The result must equal attention over the request's
// K/V held contiguously. Decode steps run inside the last page and with lookahead pages.
#include "kernels/kernel_fixture.hpp"

#include <catch2/catch.hpp>

#include <kvmm/manager/kernel_exports.hpp>
#include <kvmm/manager/kv_cache_manager.hpp>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;

TEST_CASE("manager exports read back through the CPU kernels equal contiguous attention", "[kernels][export]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 2, 2, 64, 2, 16), LayerGroup::sliding_window("local", 1, 4, 128, 2, 16, 24)});
  const std::uint32_t num_large = 64;  // the manager's; one more large page holds the zero page
  KVCacheManager kv(layout, {.num_large_pages = num_large, .max_requests = 8});
  Buffer arena;
  arena.resize((num_large + 1) * layout.large_page_bytes());
  std::memset(arena.data(), 0, (num_large + 1) * layout.large_page_bytes());
  std::mt19937_64 rng(15);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  const DType dt = DType::kF16;
  const std::uint32_t batch = 3;
  std::vector<EngineGroup> groups = {
      {0, 1, AttentionOptions{}, 8, {}, {}},
      {1, 0, AttentionOptions{MaskKind::kSlidingWindow, 24, 0, 0.0f, 0.0f}, 4, {}, {}},
  };
  for (auto& g : groups) {
    g.k_tok.resize(batch);
    g.v_tok.resize(batch);
  }
  std::vector<RequestId> ids(batch);
  std::vector<std::uint32_t> lens(batch, 0);
  std::uint32_t zero_pages_read = 0, inside_last_page = 0;
  for (int step = 0; step < 14; ++step) {
    kv.begin_step();
    std::vector<std::uint32_t> q_indptr(batch + 1, 0);
    for (std::uint32_t b = 0; b < batch; ++b) {
      const std::uint32_t n = step == 0 ? std::uniform_int_distribution<std::uint32_t>(5, 40)(rng) : 1;
      std::vector<std::uint32_t> tok(n);
      for (auto& t : tok) t = static_cast<std::uint32_t>(rng());
      if (step == 0) {
        ids[b] = kv.add_request(tok);
        kv.lookup_prefix(ids[b]);
      } else {
        kv.append_tokens(ids[b], tok);
      }
      REQUIRE(kv.allocate(ids[b], n, step % 3 == 2 ? 16 : 0));  // some steps with lookahead pages
      q_indptr[b + 1] = q_indptr[b] + n;
    }
    const std::uint32_t rows = q_indptr[batch];
    for (EngineGroup& g : groups) {
      const LayerGroup& lg = layout.group(g.id);
      const std::uint32_t P = lg.tokens_per_page;
      const PagedKVCache cache{static_cast<char*>(arena.data()) + layout.k_offset(g.id, g.layer),
                               static_cast<char*>(arena.data()) + layout.v_offset(g.id, g.layer),
                               layout.small_page_bytes(g.id),
                               P,
                               lg.kv_heads,
                               lg.head_dim,
                               dt};
      // The new tokens' K/V into the pages their rows name.
      write_step_kv(g, cache, q_indptr, lens, rng,
                    [&](std::uint32_t b, std::uint32_t pos) { return kv.page_table(ids[b], g.id)[pos / P]; });
      // The export as FlashInfer takes it, with the reserved zero page for freed pages.
      const PageId zero_page = num_large * layout.small_pages_per_large_page(g.id);
      std::vector<std::int32_t> indptr(batch + 1), indices(512), last(batch);
      KernelExports(kv).export_csr(g.id, ids, indptr, indices, last, {.null_page = zero_page});
      std::vector<std::uint32_t> uindptr(batch + 1), kv_lens(batch);
      std::vector<PageId> pages(indices.size());
      std::vector<std::vector<bool>> token_null(batch);
      for (std::uint32_t b = 0; b <= batch; ++b) uindptr[b] = static_cast<std::uint32_t>(indptr[b]);
      for (std::uint32_t b = 0; b < batch; ++b) {
        const auto n_pages = static_cast<std::uint32_t>(indptr[b + 1] - indptr[b]);
        kv_lens[b] = (n_pages - 1) * P + static_cast<std::uint32_t>(last[b]);  // FlashInfer's rule
        REQUIRE(kv_lens[b] == lens[b] + q_indptr[b + 1] - q_indptr[b]);
        inside_last_page += last[b] != static_cast<std::int32_t>(P);
        token_null[b].assign(kv_lens[b], false);
        for (std::uint32_t i = 0; i < n_pages; ++i) {
          REQUIRE(indices[indptr[b] + i] >= 0);
          pages[indptr[b] + i] = static_cast<PageId>(indices[indptr[b] + i]);
          if (pages[indptr[b] + i] != zero_page) continue;
          ++zero_pages_read;
          for (std::uint32_t t = i * P; t < (i + 1) * P && t < kv_lens[b]; ++t) token_null[b][t] = true;
        }
      }
      std::vector<std::uint16_t> q(std::size_t{rows} * g.q_heads * lg.head_dim);
      for (auto& x : q) x = from_float(dt, 2.0f * val(rng));
      std::vector<std::uint16_t> o(q.size(), 0xffff);
      PagedAttentionParams p;
      p.query =
          QueryBatch{q.data(), o.data(), rows, batch, g.q_heads, kv_lens.data(), step == 0 ? q_indptr.data() : nullptr};
      p.cache = cache;
      p.table = PageTableView{uindptr.data(), pages.data(), 0};
      p.options = g.options;
      if (step == 0)
        cpu::paged_prefill_attention(p);
      else
        cpu::paged_decode_attention(p);
      // The zero page holds only tokens the window masks: the contiguous computation skips them.
      const auto want = naive_attention(dt, lg.head_dim, lg.kv_heads, g.q_heads, g.options, q, kv_lens, q_indptr,
                                        g.k_tok, g.v_tok, token_null);
      INFO("step " << step << " group " << g.id);
      CHECK(max_rel_error(dt, o, want, 1e-4) <= unit_roundoff(dt) * 1.01);
    }
    for (std::uint32_t b = 0; b < batch; ++b) {
      lens[b] += q_indptr[b + 1] - q_indptr[b];
      kv.commit(ids[b], lens[b]);  // the window's pages leave the rows: the zero page next step
    }
  }
  CHECK(zero_pages_read > 0);
  CHECK(inside_last_page > 0);
  for (RequestId r : ids) kv.free(r);
  kv.check_invariants();
}
