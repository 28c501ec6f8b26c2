// The cuDNN paged-SDPA tensors over kvmm's page-layer layout (kernels/cudnn_paged.hpp,
// issue 37 item 3, host part): every (page, head, token, element) the strides address is
// the byte the CPU reference reads for that token, for K and V, every layer, the page
// sizes kvmm plans; groups and sizes cuDNN cannot take are refused with kvmm::Error.
#include "../../kernels/cudnn_paged.hpp"

#include <catch2/catch.hpp>
#include <kvmm/kernels/addressing.hpp>

#include <algorithm>
#include <vector>

using namespace kvmm;
using namespace kvmm::kernels;

TEST_CASE("cuDNN's paged K/V containers address the reference's rows", "[kernels][tc_prefill][cudnn]") {
  for (std::uint32_t tpp : {1u, 16u, 17u, 64u, 512u})
    for (std::uint32_t d : {64u, 128u, 256u}) {
      constexpr std::uint32_t layers = 4, kv_heads = 2, pages = 9;
      const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("g", layers, kv_heads, d, 2, tpp)});
      const std::uint64_t page_bytes = layout.small_page_bytes(0), row = kv_heads * d * 2;
      int bad = 0;
      for (std::uint32_t layer = 0; layer < layers; ++layer) {
        const CudnnPagedKV c = cudnn_paged_kv(layout, 0, layer, pages, 3, 7);
        CHECK(c.k.dims[0] == pages);
        CHECK(c.k.dims[1] == kv_heads);
        CHECK(c.k.dims[2] == tpp);
        CHECK(c.k.dims[3] == d);
        CHECK(c.page_table_dims[0] == 3);
        CHECK(c.page_table_dims[2] == 7);
        for (std::uint32_t page : {0u, 4u, 8u})
          for (std::uint32_t t : {0u, tpp / 2, tpp - 1})
            for (std::uint32_t h = 0; h < kv_heads; ++h)
              for (std::uint32_t j : {0u, 1u, d - 1})
                for (const CudnnPagedTensor* x : {&c.k, &c.v}) {
                  const std::uint64_t got =
                      x->offset + 2 * static_cast<std::uint64_t>(page * x->strides[0] + h * x->strides[1] +
                                                                 t * x->strides[2] + j * x->strides[3]);
                  const std::uint64_t want = static_cast<std::uint64_t>(page_row_offset(page, t, page_bytes, row)) +
                                             (x == &c.k ? layout.k_offset(0, layer) : layout.v_offset(0, layer)) +
                                             h * d * 2 + j * 2;
                  bad += got != want;
                }
      }
      INFO("tpp " << tpp << " d " << d);
      CHECK(bad == 0);
    }
}

TEST_CASE("groups and sizes cuDNN's paged SDPA cannot take are refused", "[kernels][tc_prefill][cudnn]") {
  const KVLayout ok = KVLayout::plan({LayerGroup::full_attention("g", 2, 2, 128, 2, 16)});
  CHECK_NOTHROW(cudnn_paged_kv(ok, 0, 1, 100, 1, 1));
  CHECK_THROWS_WITH(cudnn_paged_kv(ok, 0, 2, 100, 1, 1), Catch::Contains("layer = 2"));
  CHECK_THROWS_WITH(cudnn_paged_kv(ok, 0, 0, 0, 1, 1), Catch::Contains("num_pages = 0"));
  CHECK_THROWS_WITH(cudnn_paged_kv(ok, 0, 0, std::uint64_t{1} << 31, 1, 1), Catch::Contains("num_pages = 2147483648"));
  CHECK_THROWS_WITH(cudnn_paged_kv(ok, 0, 0, 10, 0, 1), Catch::Contains("batch = 0"));
  const KVLayout fp32 = KVLayout::plan({LayerGroup::full_attention("g", 2, 2, 128, 4, 16)});
  CHECK_THROWS_WITH(cudnn_paged_kv(fp32, 0, 0, 10, 1, 1), Catch::Contains("dtype_bytes = 4"));
  const KVLayout wide = KVLayout::plan({LayerGroup::full_attention("g", 2, 1, 512, 2, 16)});
  CHECK_THROWS_WITH(cudnn_paged_kv(wide, 0, 0, 10, 1, 1), Catch::Contains("head_dim = 512"));
  const KVLayout mla = KVLayout::plan({LayerGroup::mla("mla", 2, 512, 64, ElementFormat{}, std::nullopt, 64)});
  CHECK_THROWS_AS(cudnn_paged_kv(mla, 0, 0, 10, 1, 1), kvmm::Error);
  const KVLayout state = KVLayout::plan({LayerGroup::mamba_state("m", 2, 4096)});
  CHECK_THROWS_AS(cudnn_paged_kv(state, 0, 0, 10, 1, 1), kvmm::Error);
}

TEST_CASE("cuDNN container strides: kvmm's page-layer arena and the head-major packed form", "[kernels][cudnn]") {
  // The page-layer strides from a kernel's PagedKVCache equal cudnn_paged_kv's for the
  // planner's page stride, and address page_row_offset's rows for a padded one.
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("g", 2, 2, 128, 2, 16)});
  const CudnnPagedKV c = cudnn_paged_kv(layout, 0, 1, 10, 1, 1);
  std::int64_t s[4];
  cudnn_container_strides(CudnnKVLayout::kPageLayer, layout.small_page_bytes(0), 2, 16, 128, 2, s);
  for (int i = 0; i < 4; ++i) CHECK(s[i] == c.k.strides[i]);
  const std::uint64_t padded = layout.small_page_bytes(0) + 48, row = 2 * 128 * 2;
  cudnn_container_strides(CudnnKVLayout::kPageLayer, padded, 2, 16, 128, 2, s);
  int bad = 0;
  for (std::uint32_t page : {0u, 3u, 7u})
    for (std::uint32_t t : {0u, 5u, 15u})
      for (std::uint32_t h : {0u, 1u})
        for (std::uint32_t j : {0u, 127u})
          bad += 2 * static_cast<std::uint64_t>(page * s[0] + h * s[1] + t * s[2] + j * s[3]) !=
                 static_cast<std::uint64_t>(page_row_offset(page, t, padded, row)) + h * 256 + j * 2;
  CHECK(bad == 0);
  // Head-major: every (page, head, token, element) once, densely.
  cudnn_container_strides(CudnnKVLayout::kHeadMajor, 0, 2, 16, 128, 2, s);
  std::vector<int> seen(5 * 2 * 16 * 128, 0);
  for (std::int64_t p = 0; p < 5; ++p)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t t = 0; t < 16; ++t)
        for (std::int64_t j = 0; j < 128; ++j)
          ++seen[static_cast<std::size_t>(p * s[0] + h * s[1] + t * s[2] + j * s[3])];
  CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<std::ptrdiff_t>(seen.size()));
  CHECK_THROWS_WITH(cudnn_container_strides(CudnnKVLayout::kPageLayer, 1001, 2, 16, 128, 2, s),
                    Catch::Contains("page_stride = 1001"));
  CHECK_THROWS_WITH(cudnn_container_strides(CudnnKVLayout::kPageLayer, 16 * row - 2, 2, 16, 128, 2, s),
                    Catch::Contains("smaller than a page"));
}

TEST_CASE("cuDNN's sequence lengths and ragged Q offsets from kvmm's query batch", "[kernels][cudnn]") {
  const CudnnPrefillIndex x = cudnn_prefill_index({0, 3, 3 + 7, 3 + 7 + 1}, {10, 7, 900}, 32, 128);
  CHECK(x.seq_len_q == std::vector<std::int32_t>{3, 7, 1});
  CHECK(x.seq_len_kv == std::vector<std::int32_t>{10, 7, 900});
  CHECK(x.q_offsets == std::vector<std::int32_t>{0, 3 * 4096, 10 * 4096, 11 * 4096});
  CHECK(x.max_q_len == 7);
  CHECK(x.max_kv_len == 900);
  CHECK_THROWS_WITH(cudnn_prefill_index({0, 3}, {10, 7}, 32, 128), Catch::Contains("q_indptr.size() = 2"));
  CHECK_THROWS_WITH(cudnn_prefill_index({0, 11}, {10}, 32, 128), Catch::Contains("kv_lens = 10"));
  CHECK_THROWS_WITH(cudnn_prefill_index({0, 5, 4}, {10, 10}, 32, 128), Catch::Contains("q_indptr[2] = 4"));
  CHECK_THROWS_WITH(cudnn_prefill_index({0, 600000}, {600000}, 32, 128), Catch::Contains("over int32"));
}
