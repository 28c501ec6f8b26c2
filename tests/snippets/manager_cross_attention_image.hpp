// Harness of docs/manager.md's cross-attention image snippet (scripts/doc_snippets.py puts
// its statements in snippet_body() after this file): a Llama-3.2-Vision manager, a
// 1,000-token text and an image hash; main() runs it and checks the request was registered
// with the image (add_request raises for an item outside the prompt). Cost: milliseconds.
#pragma once

#include <kvmm/caching/block_hash.hpp>
#include <kvmm/manager/kv_cache_manager.hpp>
#include <kvmm/spec/presets.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

kvmm::KVCacheManager kv(kvmm::presets::llama3_2_11b_vision({.tokens_per_page = 16}), {.num_large_pages = 4096});
const std::vector<std::uint32_t> text(1000, 5);
const kvmm::BlockHash pixel_hash{0x1234, 0x5678};

void snippet_body();

int main() {
  snippet_body();
  if (kv.num_active() != 1) {
    std::fputs("docs/manager.md image snippet: the request was not registered\n", stderr);
    return 1;
  }
  return 0;
}
