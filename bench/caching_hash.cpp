// Block-hash throughput: chained XXH3-128 over pages of 16 tokens (and 512-token Mamba
// checkpoint pages), the cost lookup_prefix and commit pay once per full page; and the
// same chain under each BlockHashOptions function (BM_HasherPages: per page).
#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/block_hasher.hpp"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

void BM_HashChain(benchmark::State& state) {
  const auto tokens_per_page = static_cast<std::uint32_t>(state.range(0));
  const std::uint32_t pages = 8192;
  std::vector<std::uint32_t> tokens(std::size_t{tokens_per_page} * pages);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i * 2654435761u);
  const std::span<const std::uint32_t> all(tokens);
  for (auto _ : state) {
    kvmm::BlockHash h{};
    for (std::uint32_t p = 0; p < pages; ++p)
      h = kvmm::hash_page(h, all.subspan(std::size_t{p} * tokens_per_page, tokens_per_page), {});
    benchmark::DoNotOptimize(h);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * pages);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * pages * tokens_per_page * 4);
}
BENCHMARK(BM_HashChain)->Arg(16)->Arg(64)->Arg(512);

// hash_pages: the bulk path lookup_prefix and commit use (same values as BM_HashChain).
void BM_HashPages(benchmark::State& state) {
  const auto tokens_per_page = static_cast<std::uint32_t>(state.range(0));
  const std::uint32_t pages = 8192;
  std::vector<std::uint32_t> tokens(std::size_t{tokens_per_page} * pages);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i * 2654435761u);
  std::vector<kvmm::BlockHash> out(pages);
  for (auto _ : state) {
    kvmm::hash_pages({}, tokens, tokens_per_page, 0, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * pages);
}
BENCHMARK(BM_HashPages)->Arg(16);

// BlockHasher::hash_pages of a salted request (the function applies) over 1024 pages.
// Arg 0: function (0 XXH3-128, 1 SHA-256, 2 keyed BLAKE2b); arg 1: tokens per page.
void BM_HasherPages(benchmark::State& state) {
  kvmm::BlockHashOptions o;
  o.function = static_cast<kvmm::BlockHashFunction>(state.range(0));
  if (o.function == kvmm::BlockHashFunction::kBlake2bKeyed) o.key = "0123456789abcdef0123456789ABCDEF";
  const kvmm::BlockHasher hasher(o);
  const auto tokens_per_page = static_cast<std::uint32_t>(state.range(1));
  const std::uint32_t pages = 1024;
  std::vector<std::uint32_t> tokens(std::size_t{tokens_per_page} * pages);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i * 2654435761u);
  std::vector<kvmm::BlockHash> out(pages);
  for (auto _ : state) {
    hasher.hash_pages(true, {}, tokens, tokens_per_page, 0, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * pages);
  state.SetLabel(std::string(kvmm::to_string(o.function)));
}
BENCHMARK(BM_HasherPages)->ArgsProduct({{0, 1, 2}, {16, 64}});

}  // namespace

BENCHMARK_MAIN();
