// write_kv, copy_pages and swap_pages references: exact placement in the page-layer
// layout (every layer's K and V at the KVLayout offsets, explicit page stride), bytes
// outside the written rows untouched, null-page tokens skipped, and fp16/bf16 conversion.
#include "kernels/kernel_fixture.hpp"

#include <catch2/catch.hpp>

#include <kvmm/error.hpp>

#include <bit>

using namespace kvmm;
using namespace kvmm::kernels;
using namespace kvmm::test;

TEST_CASE("paged write_kv places tokens in the page-layer layout", "[kernels][write_kv]") {
  for (std::uint32_t tpp : {1u, 16u, 17u}) {
    const std::uint32_t kv_heads = 2, d = 64, layers = 3, pages = 9;
    const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("g", layers, kv_heads, d, 2, tpp)});
    const std::uint64_t stride = layout.small_page_bytes(0) + 16;
    Buffer arena;
    arena.resize(pages * stride);
    auto* bytes = reinterpret_cast<unsigned char*>(arena.data());
    std::fill(bytes, bytes + arena.size(), 0xa5);
    std::mt19937_64 rng(tpp);
    const std::uint32_t n = 40;
    const std::uint64_t row = std::uint64_t{kv_heads} * d * 2;
    std::vector<std::uint16_t> k(n * row / 2), v(n * row / 2);
    for (auto& x : k) x = static_cast<std::uint16_t>(rng());
    for (auto& x : v) x = static_cast<std::uint16_t>(rng());
    // Distinct (page, offset) slots, some tokens padding (null page).
    std::vector<std::uint32_t> slots(pages * tpp);
    std::iota(slots.begin(), slots.end(), 0u);
    std::shuffle(slots.begin(), slots.end(), rng);
    std::vector<PageId> ids(n);
    std::vector<std::uint32_t> offs(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      ids[i] = i % 7 == 3 ? kNullPage : slots[i % slots.size()] / tpp;
      offs[i] = slots[i % slots.size()] % tpp;
    }
    const std::uint32_t layer = 2;
    std::vector<unsigned char> expect(bytes, bytes + arena.size());
    for (std::uint32_t i = 0; i < n && i < slots.size(); ++i) {
      if (ids[i] == kNullPage) continue;
      const std::uint64_t base = ids[i] * stride + offs[i] * row;
      std::memcpy(&expect[layout.k_offset(0, layer) + base], reinterpret_cast<const char*>(k.data()) + i * row, row);
      std::memcpy(&expect[layout.v_offset(0, layer) + base], reinterpret_cast<const char*>(v.data()) + i * row, row);
    }
    const std::uint32_t count = std::min<std::uint32_t>(n, static_cast<std::uint32_t>(slots.size()));
    PagedWriteParams p{PagedKVCache{bytes + layout.k_offset(0, layer), bytes + layout.v_offset(0, layer), stride, tpp,
                                    kv_heads, d, DType::kBF16},
                       k.data(),
                       v.data(),
                       ids.data(),
                       offs.data(),
                       count};
    cpu::write_kv(p);
    CHECK(std::equal(expect.begin(), expect.end(), bytes));
    // Offsets past the page are misuse, caught before anything is written.
    offs[0] = tpp;
    ids[0] = 0;
    std::vector<unsigned char> snapshot(bytes, bytes + arena.size());
    CHECK_THROWS_WITH(cpu::write_kv(p), Catch::Contains("page_offsets[0] = " + std::to_string(tpp)));
    CHECK(std::equal(snapshot.begin(), snapshot.end(), bytes));
  }
}

TEST_CASE("contiguous write_kv places tokens at slot and position", "[kernels][write_kv]") {
  const std::uint32_t kv_heads = 4, d = 128, max_ctx = 33, slots = 3;
  const std::uint64_t row = std::uint64_t{kv_heads} * d * 2;
  const std::uint64_t stride = max_ctx * row + 64;
  Buffer kb, vb;
  kb.resize(slots * stride);
  vb.resize(slots * stride);
  std::mt19937_64 rng(4);
  const std::uint32_t n = 20;
  std::vector<std::uint16_t> k(n * row / 2), v(n * row / 2);
  for (auto& x : k) x = static_cast<std::uint16_t>(rng());
  for (auto& x : v) x = static_cast<std::uint16_t>(rng());
  std::vector<std::uint32_t> slot(n), pos(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    slot[i] = i % slots;
    pos[i] = (i * 7) % max_ctx;
  }
  ContiguousWriteParams p{ContiguousKVCache{kb.data(), vb.data(), stride, max_ctx, kv_heads, d, DType::kF16},
                          k.data(),
                          v.data(),
                          slot.data(),
                          pos.data(),
                          n};
  cpu::write_kv(p);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint64_t at = slot[i] * stride + pos[i] * row;
    CHECK(std::memcmp(static_cast<char*>(kb.data()) + at, reinterpret_cast<char*>(k.data()) + i * row, row) == 0);
    CHECK(std::memcmp(static_cast<char*>(vb.data()) + at, reinterpret_cast<char*>(v.data()) + i * row, row) == 0);
  }
  pos[5] = max_ctx;
  CHECK_THROWS_WITH(cpu::write_kv(p), Catch::Contains("positions[5] = 33"));
}

TEST_CASE("head-major write_kv puts each head's row at (h x tokens + t) x head_dim", "[kernels][write_kv]") {
  // Stated here independently of kv_strides: K(page p, token t, head h, dim j) at
  // p x stride + ((h x tokens_per_page + t) x d + j) x 2; contiguous (h x max_ctx + pos).
  const std::uint32_t kv_heads = 3, d = 64, tpp = 5, pages = 4, n = 11;
  const std::uint64_t head_row = d * 2, stride = tpp * kv_heads * head_row + 32;
  Buffer kb, vb;
  kb.resize(pages * stride);
  vb.resize(pages * stride);
  std::vector<std::uint16_t> k(n * kv_heads * d), v(k.size());
  for (std::size_t e = 0; e < k.size(); ++e) {
    k[e] = static_cast<std::uint16_t>(e);
    v[e] = static_cast<std::uint16_t>(e + 40000);
  }
  std::vector<PageId> ids(n);
  std::vector<std::uint32_t> offs(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    ids[i] = (i * 3 + 1) % pages;
    offs[i] = (i * 2) % tpp;  // distinct (page, offset) for these 11 tokens
  }
  PagedKVCache cache{kb.data(), vb.data(), stride, tpp, kv_heads, d, DType::kBF16, KVOrder::kHeadMajor};
  cpu::write_kv(PagedWriteParams{cache, k.data(), v.data(), ids.data(), offs.data(), n});
  auto at = [](const Buffer& b, std::uint64_t byte) {
    std::uint16_t x;
    std::memcpy(&x, reinterpret_cast<const char*>(b.blocks.data()) + byte, 2);
    return x;
  };
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint32_t h = 0; h < kv_heads; ++h)
      for (std::uint32_t j = 0; j < d; j += 7) {
        const std::uint64_t byte = ids[i] * stride + ((h * tpp + offs[i]) * d + j) * 2;
        CHECK(at(kb, byte) == k[(i * kv_heads + h) * d + j]);
        CHECK(at(vb, byte) == v[(i * kv_heads + h) * d + j]);
      }
  const std::uint32_t max_ctx = 7, slots = 2;
  const std::uint64_t slot_stride = max_ctx * kv_heads * head_row + 16;
  kb.resize(slots * slot_stride);
  vb.resize(slots * slot_stride);
  std::vector<std::uint32_t> slot(n), pos(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    slot[i] = i % slots;
    pos[i] = i / slots;
  }
  const ContiguousKVCache cc{kb.data(), vb.data(), slot_stride,  max_ctx,
                             kv_heads,  d,         DType::kBF16, KVOrder::kHeadMajor};
  cpu::write_kv(ContiguousWriteParams{cc, k.data(), v.data(), slot.data(), pos.data(), n});
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint32_t h = 0; h < kv_heads; ++h)
      for (std::uint32_t j = 0; j < d; j += 5) {
        const std::uint64_t byte = slot[i] * slot_stride + ((h * max_ctx + pos[i]) * d + j) * 2;
        CHECK(at(kb, byte) == k[(i * kv_heads + h) * d + j]);
        CHECK(at(vb, byte) == v[(i * kv_heads + h) * d + j]);
      }
}

TEST_CASE("copy_pages and swap_pages move whole pages", "[kernels][copy]") {
  std::mt19937_64 rng(6);
  const std::uint64_t page_bytes = 4096 + 48, stride = 4096 + 64;
  const std::uint32_t pages = 24;
  std::vector<unsigned char> arena(pages * stride);
  for (auto& b : arena) b = static_cast<unsigned char>(rng());
  // Copy-on-write copies: sources and destinations are disjoint pages.
  std::vector<PageId> src = {0, 5, 5, 9, 11}, dst = {1, 6, 7, 20, 23};
  std::vector<unsigned char> expect = arena;
  for (std::size_t i = 0; i < src.size(); ++i)
    std::memcpy(&expect[dst[i] * stride], &arena[src[i] * stride], page_bytes);
  cpu::copy_pages(PageCopyParams{arena.data(), arena.data(), stride, stride, page_bytes, src.data(), dst.data(),
                                 static_cast<std::uint32_t>(src.size())});
  CHECK(arena == expect);
  // Swap out to a host buffer with its own (dense) stride and back into other pages.
  std::vector<unsigned char> host(3 * page_bytes, 0);
  std::vector<PageId> out_src = {2, 3, 4}, host_ids = {2, 0, 1}, back = {12, 13, 14};
  cpu::swap_pages(
      PageCopyParams{host.data(), arena.data(), page_bytes, stride, page_bytes, out_src.data(), host_ids.data(), 3});
  cpu::swap_pages(
      PageCopyParams{arena.data(), host.data(), stride, page_bytes, page_bytes, host_ids.data(), back.data(), 3});
  for (int i = 0; i < 3; ++i)
    CHECK(std::memcmp(&arena[back[i] * stride], &arena[out_src[i] * stride], page_bytes) == 0);
  CHECK_THROWS_WITH(
      cpu::copy_pages(PageCopyParams{arena.data(), arena.data(), stride, 100, page_bytes, src.data(), dst.data(), 1}),
      Catch::Contains("page_bytes = 4144"));
}

TEST_CASE("fp16 and bf16 conversions round to nearest even", "[kernels][dtype]") {
  // Every finite 16-bit pattern survives a round trip through float.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    const float f = f16_to_float(x);
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_float(float_to_f16(f))));
    } else {
      REQUIRE(float_to_f16(f) == x);
    }
    const float g = bf16_to_float(x);
    if (!std::isnan(g)) REQUIRE(float_to_bf16(g) == x);
  }
  CHECK(f16_to_float(0x3c00) == 1.0f);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(float_to_f16(65520.0f) == 0x7c00);  // rounds to infinity
  CHECK(float_to_f16(65519.0f) == 0x7bff);
  CHECK(float_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even
  CHECK(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  // Random floats convert to a nearest representable value.
  std::mt19937 rng(8);
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()) & 0xc7ffffffu);  // |f| < 2^16
    const std::uint16_t h = float_to_f16(f);
    if (std::isinf(f16_to_float(h))) {
      REQUIRE(std::abs(f) >= 65520.0f);
      continue;
    }
    const double err = std::abs(double(f16_to_float(h)) - f);
    for (int step : {-1, 1}) {
      const auto nb = static_cast<std::uint16_t>(h + step);
      const float g = f16_to_float(nb);
      if (std::isfinite(g) && (nb & 0x7fff) != 0x7fff) REQUIRE(err <= std::abs(double(g) - f));
    }
    const std::uint16_t b = float_to_bf16(f);
    const double eb = std::abs(double(bf16_to_float(b)) - f);
    for (int step : {-1, 1}) {
      const float g = bf16_to_float(static_cast<std::uint16_t>(b + step));
      if (std::isfinite(g)) REQUIRE(eb <= std::abs(double(g) - f));
    }
  }
}
