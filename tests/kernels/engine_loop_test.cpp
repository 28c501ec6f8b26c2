// The CPU kernels used the way an engine uses them, on pages handed out by kvmm's own
// PagedKVAllocator for a two-group model (full attention + sliding window, different
// shapes sharing one arena of large pages): a chunked prefill, then decode steps, each
// step writing K/V through the slot mapping and attending through the exported CSR
// tables; out-of-window pages are replaced by the null page as a freeing engine would.
#include "kernels/kernel_fixture.hpp"

#include <catch2/catch.hpp>

#include <kvmm/paging/kv_allocator.hpp>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;

TEST_CASE("prefill then decode steps over PagedKVAllocator pages match naive attention", "[kernels][engine]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 2, 2, 64, 2, 16), LayerGroup::sliding_window("local", 1, 4, 128, 2, 16, 24)});
  const std::uint32_t num_large = 64;
  PagedKVAllocator kv(layout, {.num_large_pages = num_large, .max_requests = 8});
  Buffer arena;
  arena.resize(num_large * layout.large_page_bytes());
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  const DType dt = DType::kF16;
  const std::uint32_t batch = 3;
  std::vector<RequestId> ids(batch);
  for (auto& r : ids) r = kv.add_request();
  std::vector<Row> id_rows(batch);
  for (std::uint32_t b = 0; b < batch; ++b) id_rows[b] = kv.row(ids[b]);

  std::vector<EngineGroup> groups = {
      {0, 1, AttentionOptions{}, 8, {}, {}},
      {1, 0, AttentionOptions{MaskKind::kSlidingWindow, 24, 0, 0.0f, 0.0f}, 4, {}, {}},
  };
  for (auto& g : groups) {
    g.k_tok.resize(batch);
    g.v_tok.resize(batch);
  }
  std::vector<std::uint32_t> lens(batch, 0);
  std::uint32_t nulls_seen = 0;
  for (int step = 0; step < 12; ++step) {
    // Step 0 is a prefill chunk of 5..40 tokens per request, then one token per step.
    std::vector<std::uint32_t> q_indptr(batch + 1, 0);
    for (std::uint32_t b = 0; b < batch; ++b) {
      const std::uint32_t n = step == 0 ? std::uniform_int_distribution<std::uint32_t>(5, 40)(rng) : 1;
      REQUIRE(kv.append_tokens(ids[b], n));
      q_indptr[b + 1] = q_indptr[b] + n;
    }
    const std::uint32_t rows = q_indptr[batch];
    for (EngineGroup& g : groups) {
      const LayerGroup& lg = layout.group(g.id);
      const std::uint64_t stride = layout.small_page_bytes(g.id);
      const PagedKVCache cache{static_cast<char*>(arena.data()) + layout.k_offset(g.id, g.layer),
                               static_cast<char*>(arena.data()) + layout.v_offset(g.id, g.layer),
                               stride,
                               lg.tokens_per_page,
                               lg.kv_heads,
                               lg.head_dim,
                               dt};
      const PageTableSet& tables = kv.page_tables(g.id);
      // Slot mapping of the new tokens and their K/V.
      write_step_kv(g, cache, q_indptr, lens, rng, [&](std::uint32_t b, std::uint32_t pos) {
        return tables.pages(id_rows[b])[pos / lg.tokens_per_page];
      });
      // Tables as the engine ships them: CSR, out-of-window pages freed to the null page.
      std::vector<std::uint32_t> indptr(batch + 1), last(batch), kv_lens(batch);
      std::vector<PageId> indices(256);
      tables.export_csr(id_rows, indptr, indices, last);
      std::vector<std::vector<bool>> token_null(batch);
      for (std::uint32_t b = 0; b < batch; ++b) {
        kv_lens[b] = lens[b] + q_indptr[b + 1] - q_indptr[b];
        token_null[b].assign(kv_lens[b], false);
        if (g.options.mask != MaskKind::kSlidingWindow) continue;
        const std::uint32_t first_q = kv_lens[b] - (q_indptr[b + 1] - q_indptr[b]);
        const std::uint32_t lo = first_q + 1 > g.options.window ? first_q + 1 - g.options.window : 0;
        for (std::uint32_t pg = 0; (pg + 1) * lg.tokens_per_page <= lo; ++pg) {
          indices[indptr[b] + pg] = kNullPage;
          ++nulls_seen;
        }
      }
      std::vector<std::uint16_t> q(std::size_t{rows} * g.q_heads * lg.head_dim);
      for (auto& x : q) x = from_float(dt, 2.0f * val(rng));
      std::vector<std::uint16_t> o(q.size(), 0xffff);
      PagedAttentionParams p;
      p.query =
          QueryBatch{q.data(), o.data(), rows, batch, g.q_heads, kv_lens.data(), step == 0 ? q_indptr.data() : nullptr};
      p.cache = cache;
      p.table = PageTableView{indptr.data(), indices.data(), 0};
      p.options = g.options;
      p.split.num_splits = 2;
      if (step == 0)
        cpu::paged_prefill_attention(p);
      else
        cpu::paged_decode_attention(p);
      const auto want = naive_attention(dt, lg.head_dim, lg.kv_heads, g.q_heads, g.options, q, kv_lens, q_indptr,
                                        g.k_tok, g.v_tok, token_null);
      INFO("step " << step << " group " << g.id);
      CHECK(max_rel_error(dt, o, want, 1e-4) <= unit_roundoff(dt) * 1.01);
    }
    for (std::uint32_t b = 0; b < batch; ++b) lens[b] += q_indptr[b + 1] - q_indptr[b];
  }
  CHECK(nulls_seen > 0);
  for (RequestId r : ids) kv.free_request(r);
  kv.check_invariants();
}
