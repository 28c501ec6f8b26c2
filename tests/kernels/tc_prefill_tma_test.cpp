// The per-group TMA tensor map of the sm_90a prefill (kernels/prefill_tma.hpp, issue 37
// item 2): its parameters for the page sizes, head dims and layer counts kvmm plans, held
// against the driver's documented limits; groups it cannot describe refused with
// kvmm::Error; and a CPU model of the box copy (the emulated TMA) that gathers exactly the
// rows the CPU reference's addressing reads, for every (layer, K/V, page, token, head).
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#define KVMM_SIMT_HOST 1
#include "../../kernels/prefill_tma.hpp"

#include <catch2/catch.hpp>
#include <kvmm/error.hpp>
#include <kvmm/kernels/addressing.hpp>

#include <cstring>
#include <random>
#include <vector>

using namespace kvmm;
namespace dev = kvmm::kernels::device;

TEST_CASE("the group tensor map covers every layer, K/V and page within the TMA limits", "[kernels][tc_prefill][tma]") {
  alignas(16) static char arena[16];
  for (std::uint32_t tpp : {1u, 2u, 8u, 16u, 17u, 32u, 64u, 128u, 256u, 512u})
    for (std::uint32_t d : {64u, 128u, 256u})
      for (std::uint32_t kv_heads : {1u, 8u})
        for (std::uint32_t layers : {1u, 32u, 80u}) {
          // Pages over the planner's 64 MiB large-page bound are never planned.
          if (std::uint64_t{2} * layers * tpp * kv_heads * d * 2 > (std::uint64_t{64} << 20)) continue;
          INFO("tpp " << tpp << " d " << d << " kv_heads " << kv_heads << " layers " << layers);
          const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("g", layers, kv_heads, d, 2, tpp)});
          const std::uint64_t pages = 1'000'000;
          const dev::TensorMapSpec s = dev::group_tensor_map_spec(layout, 0, arena, pages);
          const std::uint64_t row = std::uint64_t{kv_heads} * d * 2;
          CHECK(s.rank == 5);
          CHECK(s.dims[0] == d);
          CHECK(s.dims[1] == kv_heads);
          CHECK(s.dims[2] == tpp);
          CHECK(s.dims[3] == 2 * layers);
          CHECK(s.dims[4] == pages);
          CHECK(s.strides[1] == d * 2);
          CHECK(s.strides[2] == row);
          CHECK(s.strides[3] == tpp * row);
          CHECK(s.strides[4] == layout.small_page_bytes(0));
          CHECK(s.strides[4] >= 2 * layers * tpp * row);  // the page holds every layer's K and V
          for (int i = 1; i < 5; ++i) {
            CHECK(s.strides[i] % 16 == 0);
            CHECK(s.strides[i] < (std::uint64_t{1} << 40));
          }
          CHECK(s.box[0] * s.elem_bytes == 128);  // one 128-byte swizzle span of one head
          CHECK(s.box[1] == 1);
          CHECK(s.box[2] == std::min(tpp, 64u));
          CHECK(s.box[3] == 1);
          CHECK(s.box[4] == 1);
          CHECK(s.swizzle128);
          CHECK_NOTHROW(dev::check_tensor_map(s));
        }
}

TEST_CASE("groups the tensor map cannot describe are refused", "[kernels][tc_prefill][tma]") {
  alignas(16) static char arena[16];
  const KVLayout mla = KVLayout::plan({LayerGroup::mla("mla", 4, 512, 64, ElementFormat{}, std::nullopt, 64)});
  CHECK_THROWS_AS(dev::group_tensor_map_spec(mla, 0, arena, 10), kvmm::Error);
  const KVLayout state = KVLayout::plan({LayerGroup::mamba_state("m", 2, 4096)});
  CHECK_THROWS_AS(dev::group_tensor_map_spec(state, 0, arena, 10), kvmm::Error);
  const KVLayout ok = KVLayout::plan({LayerGroup::full_attention("g", 2, 2, 64, 2, 16)});
  CHECK_THROWS_WITH(dev::group_tensor_map_spec(ok, 0, arena, 0), Catch::Contains("num_pages = 0"));
  CHECK_THROWS_WITH(dev::group_tensor_map_spec(ok, 0, arena + 8, 4), Catch::Contains("16-byte aligned"));
  CHECK_THROWS_WITH(dev::group_tensor_map_spec(ok, 0, arena, std::uint64_t{1} << 33), Catch::Contains("dims[4]"));
}

TEST_CASE("the emulated box copy gathers exactly the reference's rows", "[kernels][simt][tc_prefill][tma]") {
  for (std::uint32_t tpp : {1u, 16u, 17u, 100u}) {
    constexpr std::uint32_t layers = 3, kv_heads = 2, d = 128, pages = 5;
    const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("g", layers, kv_heads, d, 2, tpp)});
    const std::uint64_t page_bytes = layout.small_page_bytes(0), row = kv_heads * d * 2;
    std::vector<std::uint16_t> arena(pages * page_bytes / 2 + 8);
    std::mt19937 rng(tpp);
    for (auto& x : arena) x = static_cast<std::uint16_t>(rng());
    const dev::TensorMap map = dev::host_tensor_map(dev::group_tensor_map_spec(layout, 0, arena.data(), pages));
    const unsigned box_tok = std::min(tpp, dev::kTmaBoxTokens), box_bytes = box_tok * 128;
    alignas(1024) static unsigned char tile[64 * 128];
    static std::uint64_t bar;
    int bad = 0, boxes = 0;
    for (std::uint32_t layer = 0; layer < layers; ++layer)
      for (bool v : {false, true})
        for (std::uint32_t page : {0u, 3u, 4u})
          for (std::uint32_t tok0 : {0u, tpp > 40 ? 40u : 0u})
            for (std::uint32_t head = 0; head < kv_heads; ++head)
              for (std::uint32_t d0 : {0u, 64u}) {
                int c[5];
                dev::group_map_coord(c, d0, head, tok0, layer, v, page);
                REQUIRE(simt::launch(dim3(1), 32, [&] {
                  if (threadIdx.x == 0) {
                    dev::mbar_init(&bar, 1);
                    dev::fence_mbarrier_init();
                    dev::tma_load<5>(tile, map, c, &bar);
                    dev::mbar_arrive_expect_tx(&bar, box_bytes);
                  }
                  dev::mbar_wait(&bar, 0);
                }));
                ++boxes;
                // Token t of the box, element j: the reference's address (page row offset,
                // the layer's K/V offset, the head), zero past the page's last token.
                for (std::uint32_t t = 0; t < box_tok; ++t)
                  for (std::uint32_t j = 0; j < 64; ++j) {
                    const std::uint32_t tok = tok0 + t;
                    std::uint16_t want = 0;
                    if (tok < tpp) {
                      const std::uint64_t off =
                          static_cast<std::uint64_t>(kernels::page_row_offset(page, tok, page_bytes, row)) +
                          (v ? layout.v_offset(0, layer) : layout.k_offset(0, layer)) + head * d * 2 + (d0 + j) * 2;
                      want = arena[off / 2];
                    }
                    const unsigned lin = t * 128 + j * 2;
                    const unsigned sw = (lin & ~0x70u) | ((((lin >> 4) & 7u) ^ (t & 7u)) << 4);  // 128-byte swizzle
                    std::uint16_t got;
                    std::memcpy(&got, tile + sw, 2);
                    bad += got != want;
                  }
              }
    INFO("tpp " << tpp);
    CHECK(boxes == 3 * 2 * 3 * 2 * 2 * 2);
    CHECK(bad == 0);
  }
}

#endif
