// Issue 32 item 5 through the manager: an MLA group in vLLM's fp8_ds_mla layout, the DSA
// indexer tied to it and a recurrent state served by one KVCacheManager. Every step each
// request's new latents and indexer keys go into the pages its page table names; each
// group's CSR export rebuilds the request's kv length (FlashInfer's rule) and, read through
// the export alone, the latents give the same decode attention as the rows kept aside, and
// the indexer keys read back as written.
#include <kvmm/kernels/formatted_attention.hpp>
#include <kvmm/manager/kernel_exports.hpp>
#include <kvmm/manager/kv_cache_manager.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

using namespace kvmm;
using namespace kvmm::kernels;

namespace {

// CSR export of one group: the rows' pages and kv lengths as an engine's kernel gets them.
struct Export {
  std::vector<std::int32_t> indptr, indices, last;
};

Export export_group(KVCacheManager& kv, GroupId g, const std::vector<RequestId>& ids) {
  Export e;
  e.indptr.resize(ids.size() + 1);
  e.indices.resize(4096);
  e.last.resize(ids.size());
  KernelExports(kv).export_csr(g, ids, e.indptr, e.indices, e.last, {});
  return e;
}

}  // namespace

TEST_CASE("lineup exports: MLA latents, indexer keys and a recurrent state through the manager",
          "[kernels][export][lineup]") {
  const std::uint32_t P = 16;
  ElementFormat latent = parse_kv_cache_dtype("fp8_ds_mla");
  const KVLayout layout =
      KVLayout::plan({LayerGroup::mla("mla", 2, 128, 32, latent, ElementFormat::of(ElementType::kBf16), P),
                      LayerGroup::indexer("indexer", 2, 1, 64, parse_kv_cache_dtype("fp8_per_token_head"), P, "mla"),
                      LayerGroup::recurrent_state("state", 2,
                                                  {{"conv", {64, 3}, ElementFormat::of(ElementType::kBf16)},
                                                   {"ssm", {4, 16, 16}, ElementFormat::of(ElementType::kFp32)}})});
  const std::uint32_t num_large = 48;
  KVCacheManager kv(layout, {.num_large_pages = num_large, .max_requests = 8});
  std::vector<std::byte> arena(std::uint64_t{num_large} * layout.large_page_bytes());
  std::mt19937 rng(32);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  const std::uint32_t batch = 3, layer = 1, k_dim = 128 + 32, q_heads = 4;
  std::vector<RequestId> ids(batch);
  std::vector<std::uint32_t> lens(batch, 0);
  // Per request: the latents and indexer keys as read back right after writing them.
  std::vector<std::vector<std::vector<float>>> latents(batch), keys(batch);
  for (int step = 0; step < 10; ++step) {
    kv.begin_step();
    std::vector<std::uint32_t> n(batch);
    for (std::uint32_t b = 0; b < batch; ++b) {
      n[b] = step == 0 ? 5 + rng() % 36 : 1;
      std::vector<std::uint32_t> tok(n[b]);
      for (auto& t : tok) t = static_cast<std::uint32_t>(rng());
      if (step == 0) {
        ids[b] = kv.add_request(tok);
        kv.lookup_prefix(ids[b]);
      } else {
        kv.append_tokens(ids[b], tok);
      }
      REQUIRE(kv.allocate(ids[b], n[b], step % 3 == 2 ? 16 : 0));
      // The new tokens' latents and indexer keys into the pages the tables name.
      for (GroupId g : {GroupId{0}, GroupId{1}}) {
        const auto table = kv.page_table(ids[b], g);
        const std::vector<PageId> pages(table.begin(), table.end());
        const FormattedPages fp{&layout, g, layer, arena.data(), pages};
        for (std::uint32_t t = lens[b]; t < lens[b] + n[b]; ++t) {
          std::vector<float> row(g == 0 ? k_dim : 64), back(row.size());
          for (float& x : row) x = val(rng);
          cpu::write_row(fp, t, 0, false, row.data());
          cpu::read_row(fp, t, 0, false, back.data());
          (g == 0 ? latents : keys)[b].push_back(back);
        }
      }
    }
    // Each group's export, read alone.
    const Export mla = export_group(kv, 0, ids), idx = export_group(kv, 1, ids);
    (void)export_group(kv, 2, ids);  // a state group exports too (one checkpoint page per row)
    for (std::uint32_t b = 0; b < batch; ++b) {
      INFO("step " << step << " request " << b);
      const std::uint32_t kv_len = lens[b] + n[b];
      for (const Export* e : {&mla, &idx}) {
        const auto pages = static_cast<std::uint32_t>(e->indptr[b + 1] - e->indptr[b]);
        REQUIRE((pages - 1) * P + static_cast<std::uint32_t>(e->last[b]) == kv_len);
      }
      auto table = [&](const Export& e) {
        std::vector<PageId> t;
        for (std::int32_t i = e.indptr[b]; i < e.indptr[b + 1]; ++i) t.push_back(static_cast<PageId>(e.indices[i]));
        return t;
      };
      const std::vector<PageId> mla_pages = table(mla), idx_pages = table(idx);
      // The indexer's keys, read through its own export.
      const FormattedPages ip{&layout, 1, layer, arena.data(), idx_pages};
      std::vector<float> key(64);
      for (std::uint32_t t = 0; t < kv_len; ++t) {
        cpu::read_row(ip, t, 0, false, key.data());
        REQUIRE(key == keys[b][t]);
      }
      // Decode attention over the MLA export = dense attention over the kept latents.
      std::vector<float> q(std::size_t{q_heads} * k_dim), out(std::size_t{q_heads} * 128);
      for (float& x : q) x = val(rng);
      const double scale = 1.0 / std::sqrt(192.0);
      cpu::formatted_decode_attention(
          {{&layout, 0, layer, arena.data(), mla_pages}, kv_len, q_heads, q.data(), scale, out.data()});
      for (std::uint32_t h = 0; h < q_heads; ++h) {
        std::vector<double> logit(kv_len);
        double m = -INFINITY, l = 0;
        for (std::uint32_t t = 0; t < kv_len; ++t) {
          double d = 0;
          for (std::uint32_t i = 0; i < k_dim; ++i) d += static_cast<double>(q[h * k_dim + i]) * latents[b][t][i];
          logit[t] = d * scale;
          m = std::max(m, logit[t]);
        }
        std::vector<double> acc(128, 0.0);
        for (std::uint32_t t = 0; t < kv_len; ++t) {
          const double w = std::exp(logit[t] - m);
          l += w;
          for (std::uint32_t i = 0; i < 128; ++i) acc[i] += w * latents[b][t][i];  // V: the latent's first 128
        }
        for (std::uint32_t i = 0; i < 128; ++i) CHECK(out[h * 128 + i] == Approx(acc[i] / l).margin(1e-5));
      }
    }
    for (std::uint32_t b = 0; b < batch; ++b) {
      lens[b] += n[b];
      kv.commit(ids[b], lens[b]);
    }
  }
  for (RequestId r : ids) kv.free(r);
  kv.check_invariants();
}
