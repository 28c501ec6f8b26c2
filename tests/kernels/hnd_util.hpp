// Head-major (KVOrder::kHeadMajor) test scenarios shared by the emulated kernel tests
// (simt_kernels_test, tc_decode_test, tc_prefill_test): one random scenario stored twice,
// token-major and head-major (the same values, pages, tables and slots; only the order
// inside pages and slots differs), and the grid of configurations the tests walk: every
// mask, GQA 1/3/4/8, head dims 64/128/256, page sizes 1/16/17/32, null pages, CSR and
// dense tables, 1 or 3 splits. Host code; building a pair fills two arenas.
#pragma once

#include "kernels/kernel_fixture.hpp"

#include <cstring>
#include <string>
#include <vector>

namespace kvmm::test {

struct OrderPair {
  Scenario nhd, hnd;
  static ScenarioConfig with(ScenarioConfig c, KVOrder o) {
    c.order = o;
    return c;
  }
  explicit OrderPair(const ScenarioConfig& c) : nhd(with(c, KVOrder::kTokenMajor)), hnd(with(c, KVOrder::kHeadMajor)) {
    nhd.fill_host_caches();
    hnd.fill_host_caches();
  }
  // Whether the two caches hold different bytes (they must when kv_heads > 1: the order
  // really changed where the rows lie), but for 1-token pages, where both orders put head h
  // at h x head_dim.
  bool arenas_differ() const {
    const bool paged = std::memcmp(nhd.arena.blocks.data(), hnd.arena.blocks.data(), nhd.arena.size()) != 0;
    return paged == (nhd.cfg.tokens_per_page > 1) &&
           std::memcmp(nhd.cont_k.blocks.data(), hnd.cont_k.blocks.data(), nhd.cont_k.size()) != 0;
  }
};

struct HndCase {
  ScenarioConfig cfg;
  std::uint32_t splits = 1;
  // For INFO: the axes the grid varies.
  std::string describe() const {
    const ScenarioConfig& c = cfg;
    return "mask " + std::to_string(static_cast<int>(c.options.mask)) + " group " + std::to_string(c.group) + " tpp " +
           std::to_string(c.tokens_per_page) + " d " + std::to_string(c.head_dim) + " prefill " +
           std::to_string(c.prefill) + " nulls " + std::to_string(static_cast<int>(c.nulls)) + " csr " +
           std::to_string(c.csr) + " splits " + std::to_string(splits);
  }
};

// The grid: masks x page sizes x head dims (36 scenarios), the group, dtype, nulls, table
// form and splits cycling with the index so every value meets every mask and page size.
// max_dim: the largest head dim the kernel under test takes.
inline std::vector<HndCase> hnd_cases(bool prefill, std::uint32_t max_dim = 256) {
  std::vector<HndCase> out;
  const std::uint32_t groups[] = {1, 4, 8, 3};
  std::uint32_t index = 0;
  for (MaskKind mask : {MaskKind::kCausal, MaskKind::kSlidingWindow, MaskKind::kChunkedLocal})
    for (std::uint32_t tpp : {1u, 16u, 17u, 32u})
      for (std::uint32_t d : {64u, 128u, 256u}) {
        ++index;
        if (d > max_dim) continue;
        HndCase h;
        ScenarioConfig& c = h.cfg;
        c.options.mask = mask;
        c.options.window = 5 + index % 29;
        c.options.chunk = 3 + index % 31;
        c.group = groups[index % 4];
        c.kv_heads = 2;
        c.tokens_per_page = tpp;
        c.head_dim = d;
        c.dtype = index % 2 == 0 ? DType::kBF16 : DType::kF16;
        c.prefill = prefill;
        c.max_q_len = 9;
        c.batch = 2;
        c.max_kv_len = d == 256 ? 50 : 80;
        c.csr = index % 3 != 0;
        c.nulls = static_cast<NullMode>(index % 3);
        c.seed = 4400 + index;
        h.splits = index % 2 == 0 ? 3 : 1;
        out.push_back(h);
      }
  return out;
}

}  // namespace kvmm::test
