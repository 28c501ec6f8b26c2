// Harness of README.md's "The allocator alone" snippet (scripts/doc_snippets.py puts the
// snippet's statements in snippet_body() after this file): the names it leaves to the
// reader, and a main() that runs it once. Cost: one small manager (milliseconds).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

namespace {

std::vector<std::uint32_t> make_prompt() {
  std::vector<std::uint32_t> ids(100);
  std::iota(ids.begin(), ids.end(), 1000u);
  return ids;
}
const std::vector<std::uint32_t> prompt_ids = make_prompt();
const std::uint32_t sampled_id = 7;

// 100 tokens in 1024 large pages are never refused: a call here is a failure.
void preempt_something() {
  std::fputs("README snippet: allocate refused a 100-token prompt in an empty manager\n", stderr);
  std::exit(1);
}

}  // namespace

void snippet_body();

int main() {
  snippet_body();
  return 0;
}
