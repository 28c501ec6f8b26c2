// Issue 32 item 5 (CPU part): element codes against their definitions, rows written into
// formatted pages (fp8 / int / fp4 with per-token-head or block scales, inline or separate;
// MLA latents) read back within each format's rounding, with every row of a randomly
// permuted, over-allocated page table intact; decode attention over the pages equal to a
// dense recompute on the dequantized rows and close to the unquantized one.
#include <kvmm/error.hpp>
#include <kvmm/kernels/formatted_attention.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>
#include "support/error_of.hpp"

using namespace kvmm;
using namespace kvmm::kernels;
using kvmm::test::error_of;

namespace {

// Rounding error of a format relative to the largest magnitude of its scale block.
double tolerance(ElementType t) {
  switch (t) {
    case ElementType::kBf16:
      return 0.004;
    case ElementType::kFp16:
      return 0.001;
    case ElementType::kFp32:
      return 1e-6;
    case ElementType::kFp8E4M3:
      return 0.07;
    case ElementType::kFp8E5M2:
      return 0.13;
    case ElementType::kInt8:
      return 0.005;
    case ElementType::kInt4:
      return 0.08;
    default:
      return 0.35;  // fp4 e2m1: half a step of 2 at the top, under a power-of-two (mxfp4) scale up to 2x
  }
}

// Dense attention of one kv head's rows, in double.
std::vector<double> dense(const std::vector<std::vector<float>>& k, const std::vector<std::vector<float>>& v,
                          const float* q, double scale) {
  std::vector<double> logits(k.size());
  double m = -INFINITY;
  for (std::size_t t = 0; t < k.size(); ++t) {
    double d = 0;
    for (std::size_t i = 0; i < k[t].size(); ++i) d += static_cast<double>(q[i]) * k[t][i];
    logits[t] = d * scale;
    m = std::max(m, logits[t]);
  }
  std::vector<double> out(v[0].size(), 0.0);
  double l = 0;
  for (std::size_t t = 0; t < k.size(); ++t) {
    const double w = std::exp(logits[t] - m);
    l += w;
    for (std::size_t i = 0; i < out.size(); ++i) out[i] += w * v[t][i];
  }
  for (double& x : out) x /= l;
  return out;
}

}  // namespace

TEST_CASE("formatted: element codes", "[kernels][formats]") {
  using T = ElementType;
  CHECK(decode_element(T::kFp8E4M3, 0x7e) == 448.0f);
  CHECK(decode_element(T::kFp8E4M3, 0x08) == std::ldexp(1.0f, -6));
  CHECK(decode_element(T::kFp8E4M3, 0x01) == std::ldexp(1.0f, -9));
  CHECK(std::isnan(decode_element(T::kFp8E4M3, 0x7f)));
  CHECK(decode_element(T::kFp8E4M3, 0xb8) == -1.0f);
  CHECK(encode_element(T::kFp8E4M3, 1000.0f) == 0x7e);  // saturates
  CHECK(decode_element(T::kFp8E5M2, 0x7b) == 57344.0f);
  CHECK(std::isinf(decode_element(T::kFp8E5M2, 0x7c)));
  CHECK(decode_element(T::kFp4E2M1, 0x7) == 6.0f);
  CHECK(decode_element(T::kFp4E2M1, 0x1) == 0.5f);
  CHECK(decode_element(T::kFp4E2M1, 0xf) == -6.0f);
  CHECK(encode_element(T::kFp4E2M1, 2.5f) == 0x4);  // halfway between 2 (code 4) and 3 (code 5): even
  CHECK(decode_element(T::kInt4, encode_element(T::kInt4, -9.0f)) == -8.0f);
  CHECK(decode_element(T::kE8M0, 127) == 1.0f);
  for (T t : {T::kFp8E4M3, T::kFp8E5M2, T::kFp4E2M1, T::kInt8, T::kInt4}) {
    INFO(to_string(t));
    const std::uint32_t n = 1u << bits_of(t);
    for (std::uint32_t c = 0; c < n; ++c) {
      const float x = decode_element(t, c);
      if (!std::isfinite(x) || (x == 0 && std::signbit(x))) continue;
      CHECK(encode_element(t, x) == c);
    }
  }
  CHECK_THAT(error_of([] { decode_element(ElementType::kRaw16, 0); }), Catch::Contains("does not say which type"));
}

TEST_CASE("formatted: rows round-trip and decode attention matches a dense recompute", "[kernels][formats][random]") {
  std::mt19937 rng(532);
  const std::vector<std::string> formats{"bf16", "fp16",           "fp8_e4m3",      "fp8_e5m2",  "fp8_per_token_head",
                                         "int8", "int4",           "nvfp4",         "mxfp8",     "mxfp4",
                                         "fp32", "nvfp4:separate", "int8:separate", "fp8_ds_mla"};
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (int iter = 0; iter < 60; ++iter) {
    const bool mla = iter % 3 == 2;
    const ElementFormat kf = parse_kv_cache_dtype(formats[rng() % formats.size()]);
    const ElementFormat vf = parse_kv_cache_dtype(formats[rng() % formats.size()]);
    const std::uint32_t tpp = 1u << (rng() % 5), layers = 1 + rng() % 3;
    const std::uint32_t hd = 128u * (1 + rng() % (mla ? 4 : 2));  // every block size (16, 32, 128) divides it
    const std::uint32_t rope = mla ? 32u * (rng() % 3) : 0u;
    const std::uint32_t kv_heads = mla ? 1 : 1 + rng() % 4;
    INFO("iteration " << iter << " K " << kf.describe() << " V " << vf.describe() << " mla " << mla << " tpp " << tpp);
    LayerGroup g =
        mla ? LayerGroup::mla("g", layers, hd, rope, kf,
                              kf.scale.in_pages() ? std::optional(ElementFormat::of(ElementType::kBf16)) : std::nullopt,
                              tpp)
            : LayerGroup::full_attention("g", layers, kv_heads, hd, 2, tpp);
    if (!mla) {
      g.k_format = kf;
      g.v_format = vf;
    }
    const KVLayout l = KVLayout::plan({g});
    const std::uint32_t kv_len = 1 + rng() % 70;
    const std::uint32_t pages_needed = (kv_len + tpp - 1) / tpp;
    const std::uint32_t num_pages = pages_needed + 3;  // over-allocated arena, permuted table
    std::vector<PageId> table(num_pages);
    std::iota(table.begin(), table.end(), 0u);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<std::byte> arena(num_pages * l.small_page_bytes(0), std::byte{0xa5});
    FormattedPages pages{&l, 0, static_cast<std::uint32_t>(rng() % layers), arena.data(), table};
    if (kf.scale.granularity == ScaleGranularity::kPerTensor) pages.k_tensor_scale = 0.01f;
    if (vf.scale.granularity == ScaleGranularity::kPerTensor && !mla) pages.v_tensor_scale = 0.01f;
    const std::uint32_t k_dim = hd + rope;
    const std::uint32_t heads = l.group(0).kv_heads;
    // Values within the per-tensor range (|x| <= 448 x 0.01 for e4m3) and the others alike.
    std::vector<std::vector<std::vector<float>>> K(heads), V(heads);
    for (std::uint32_t h = 0; h < heads; ++h)
      for (std::uint32_t t = 0; t < kv_len; ++t) {
        std::vector<float> k(k_dim), v(hd);
        for (float& x : k) x = uni(rng);
        for (float& x : v) x = uni(rng);
        if (mla) std::copy(k.begin(), k.begin() + hd, v.begin());  // V is the latent's first hd
        cpu::write_row(pages, t, h, false, k.data());
        if (!mla) cpu::write_row(pages, t, h, true, v.data());
        K[h].push_back(k);
        V[h].push_back(v);
      }
    // Every row reads back within its format's rounding (a misplaced row would not).
    std::vector<std::vector<std::vector<float>>> Kq(heads), Vq(heads);
    for (std::uint32_t h = 0; h < heads; ++h)
      for (std::uint32_t t = 0; t < kv_len; ++t) {
        std::vector<float> k(k_dim), v(hd);
        cpu::read_row(pages, t, h, false, k.data());
        cpu::read_row(pages, t, h, true, v.data());
        for (std::uint32_t i = 0; i < k_dim; ++i) {
          const bool bf16_rope = mla && i >= hd && kf.scale.in_pages();  // the rope part beside a scaled latent
          const double tol = tolerance(bf16_rope ? ElementType::kBf16 : kf.type);
          if (std::abs(k[i] - K[h][t][i]) > tol + 1e-3) {
            FAIL_CHECK("K row " << t << " head " << h << " element " << i << ": " << k[i] << " vs " << K[h][t][i]);
            break;
          }
        }
        if (mla) {
          CHECK(std::equal(v.begin(), v.end(), k.begin()));  // the V view is the latent
        } else {
          for (std::uint32_t i = 0; i < hd; ++i)
            if (std::abs(v[i] - V[h][t][i]) > tolerance(vf.type) + 1e-3) {
              FAIL_CHECK("V row " << t << " head " << h << " element " << i << ": " << v[i] << " vs " << V[h][t][i]);
              break;
            }
        }
        Kq[h].push_back(k);
        Vq[h].push_back(v);
      }
    // Decode attention over the pages = dense attention over the dequantized rows.
    const std::uint32_t q_heads = heads * (1 + rng() % 3);
    std::vector<float> q(std::uint64_t{q_heads} * k_dim), out(std::uint64_t{q_heads} * hd);
    for (float& x : q) x = uni(rng);
    const double scale = 1.0 / std::sqrt(static_cast<double>(k_dim));
    cpu::formatted_decode_attention({pages, kv_len, q_heads, q.data(), scale, out.data()});
    for (std::uint32_t h = 0; h < q_heads; ++h) {
      const std::uint32_t kvh = h / (q_heads / heads);
      const std::vector<double> want = dense(Kq[kvh], Vq[kvh], q.data() + std::uint64_t{h} * k_dim, scale);
      const std::vector<double> exact = dense(K[kvh], V[kvh], q.data() + std::uint64_t{h} * k_dim, scale);
      for (std::uint32_t i = 0; i < hd; ++i) {
        CHECK(out[std::uint64_t{h} * hd + i] == Approx(want[i]).margin(1e-5));
        CHECK(std::abs(out[std::uint64_t{h} * hd + i] - exact[i]) < 0.4);
      }
    }
  }
}

TEST_CASE("formatted: bad calls name what is wrong", "[kernels][formats][errors]") {
  const KVLayout plain = KVLayout::plan({LayerGroup::full_attention("p", 1, 1, 64, 2, 4)});
  std::vector<std::byte> arena(plain.small_page_bytes(0));
  const std::vector<PageId> table{0};
  std::vector<float> row(64);
  const FormattedPages p{&plain, 0, 0, arena.data(), table};
  CHECK_THAT(error_of([&] { cpu::read_row(p, 0, 0, false, row.data()); }),
             Catch::Contains("a plain group's dtype_bytes does not say which type it is"));
  CHECK_THAT(error_of([&] { cpu::read_row(p, 4, 0, false, row.data()); }),
             Catch::Contains("token = 4: page 1 of a table of 1 pages"));
  CHECK_THAT(error_of([&] { cpu::read_row(p, 0, 1, false, row.data()); }),
             Catch::Contains("head = 1: group 'p' has 1 KV heads"));
  const KVLayout idx =
      KVLayout::plan({LayerGroup::full_attention("a", 1, 1, 64, 2, 4),
                      LayerGroup::indexer("i", 1, 1, 64, parse_kv_cache_dtype("fp8_per_token_head"), 4, "a")});
  std::vector<std::byte> arena2(idx.small_page_bytes(1));
  const FormattedPages q{&idx, 1, 0, arena2.data(), table};
  CHECK_THAT(error_of([&] { cpu::read_row(q, 0, 0, true, row.data()); }),
             Catch::Contains("group 'i': an indexer (key_only) group has no V rows"));
}
