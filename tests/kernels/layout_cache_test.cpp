// kernels::paged_cache: the PagedKVCache of (group, layer) read off a KVLayout. On a host
// arena, the CPU write_kv through it puts token t, kv head h of layer l exactly where the
// page-layer formula of the group's order says (computed here from the layout's offsets,
// independently of kv_strides), for a token-major and a head-major group, and touches no
// other byte; bad group, layer, arena and groups the kernels cannot read raise kvmm::Error
// naming them.
#include "kvmm/kernels/layout_cache.hpp"
#include "kvmm/error.hpp"
#include "kvmm/kernels/cache_ops.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>
#include "support/error_of.hpp"

using namespace kvmm;
namespace kk = kvmm::kernels;
using kvmm::test::error_of;

namespace {

KVLayout two_orders() {
  LayerGroup hnd = LayerGroup::full_attention("hnd", 2, 4, 128, 2, 8);
  hnd.kv_order = KVOrder::kHeadMajor;
  LayoutOptions o;
  o.slice_layers = SliceLayers::kOff;
  return KVLayout::plan({LayerGroup::sliding_window("nhd", 3, 2, 64, 2, 16, 64), hnd}, o);
}

}  // namespace

TEST_CASE("paged_cache: write_kv through it lands where the group's order puts each row") {
  const KVLayout layout = two_orders();
  const std::uint64_t pages_per_group = 4;
  std::mt19937_64 rng(7);
  for (GroupId g = 0; g < layout.num_groups(); ++g) {
    const LayerGroup& grp = layout.group(g);
    const std::uint64_t page = layout.small_page_bytes(g);
    for (std::uint32_t l = 0; l < grp.num_layers; ++l) {
      INFO("group " << g << " layer " << l);
      std::vector<std::byte> arena(pages_per_group * page, std::byte{0});
      const kk::PagedKVCache c = kk::paged_cache(layout, arena.data(), g, l, kk::DType::kBF16);
      CHECK(c.order == grp.kv_order);
      CHECK(c.dtype == kk::DType::kBF16);
      CHECK(c.page_stride_bytes == page);
      CHECK(c.tokens_per_page == grp.tokens_per_page);
      CHECK(c.kv_heads == grp.kv_heads);
      CHECK(c.head_dim == grp.head_dim);
      // Random rows, one per (token, head): written through the descriptor, then found at
      // the formula's address.
      const std::uint32_t n = 2 * grp.tokens_per_page + 3;
      const std::uint64_t row = std::uint64_t{grp.head_dim} * 2;
      std::vector<std::uint16_t> k(std::uint64_t{n} * grp.kv_heads * grp.head_dim), v(k.size());
      for (auto& x : k) x = static_cast<std::uint16_t>(rng());
      for (auto& x : v) x = static_cast<std::uint16_t>(rng());
      std::vector<PageId> ids(n);
      std::vector<std::uint32_t> offs(n);
      for (std::uint32_t t = 0; t < n; ++t) {
        ids[t] = static_cast<PageId>((t / grp.tokens_per_page + 1) % pages_per_group);  // pages 1, 2, 3
        offs[t] = t % grp.tokens_per_page;
      }
      kk::cpu::write_kv(kk::PagedWriteParams{c, k.data(), v.data(), ids.data(), offs.data(), n});
      std::vector<std::byte> expect(arena.size(), std::byte{0});
      for (std::uint32_t t = 0; t < n; ++t)
        for (std::uint32_t h = 0; h < grp.kv_heads; ++h) {
          const std::uint64_t in_page = grp.kv_order == KVOrder::kHeadMajor
                                            ? (std::uint64_t{h} * grp.tokens_per_page + offs[t]) * row
                                            : (std::uint64_t{offs[t]} * grp.kv_heads + h) * row;
          const std::uint64_t base = std::uint64_t{ids[t]} * page + in_page;
          const std::uint64_t src = (std::uint64_t{t} * grp.kv_heads + h) * grp.head_dim;
          std::memcpy(expect.data() + base + layout.k_offset(g, l), k.data() + src, row);
          std::memcpy(expect.data() + base + layout.v_offset(g, l), v.data() + src, row);
        }
      CHECK(std::memcmp(arena.data(), expect.data(), arena.size()) == 0);
    }
  }
  // The default element type of a plain 2-byte group is fp16.
  std::vector<std::byte> arena(layout.small_page_bytes(0));
  CHECK(kk::paged_cache(layout, arena.data(), 0, 0).dtype == kk::DType::kF16);
}

TEST_CASE("paged_cache: bad group, layer, arena or a group the kernels cannot read raise kvmm::Error") {
  const KVLayout layout = two_orders();
  std::vector<std::byte> arena(layout.small_page_bytes(0));
  std::byte* a = arena.data();
  CHECK(error_of([&] { (void)kk::paged_cache(layout, a, 2, 0); }) == "group = 2: the layout has 2 groups");
  CHECK(error_of([&] { (void)kk::paged_cache(layout, a, 1, 2); }) == "layer = 2: group = 1 ('hnd') has 2 layers");
  CHECK(error_of([&] { (void)kk::paged_cache(layout, nullptr, 0, 1); }).find("arena = null") == 0);
  CHECK(error_of([&] { (void)kk::paged_cache(layout, a, 0, 0, static_cast<kk::DType>(9)); }).find("plain_dtype = 9") ==
        0);

  LayerGroup fp8 = LayerGroup::full_attention("fp8", 1, 2, 64, 1, 16);
  fp8.k_format = fp8.v_format = parse_kv_cache_dtype("fp8_e4m3");
  LayerGroup bf16 = LayerGroup::full_attention("bf16", 1, 2, 64, 2, 16);
  bf16.k_format = bf16.v_format = ElementFormat::of(ElementType::kBf16);
  LayoutOptions o;
  o.slice_layers = SliceLayers::kOff;
  const KVLayout mixed = KVLayout::plan(
      {LayerGroup::full_attention("f32", 1, 2, 64, 4, 16), fp8, bf16, LayerGroup::mamba_state("mamba", 1, 4096, 16),
       LayerGroup::mla("mla", 1, 512, 64, ElementFormat::of(ElementType::kBf16), std::nullopt, 16)},
      o);
  std::vector<std::byte> big(mixed.large_page_bytes());
  std::byte* b = big.data();
  CHECK(error_of([&] { (void)kk::paged_cache(mixed, b, 0, 0); }).find("group = 0 ('f32'): dtype_bytes = 4") == 0);
  CHECK(error_of([&] { (void)kk::paged_cache(mixed, b, 1, 0); }).find("group = 1 ('fp8'): K fp8_e4m3") == 0);
  CHECK(kk::paged_cache(mixed, b, 2, 0).dtype == kk::DType::kBF16);
  CHECK(error_of([&] { (void)kk::paged_cache(mixed, b, 3, 0); }).find("group = 3 ('mamba')") == 0);
  CHECK(error_of([&] { (void)kk::paged_cache(mixed, b, 4, 0); }).find("group = 4 ('mla'): storage") == 0);
}
