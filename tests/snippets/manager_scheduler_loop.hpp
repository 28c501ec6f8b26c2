// Harness of docs/manager.md's "A scheduler loop" snippet (scripts/doc_snippets.py puts the
// snippet after this file): the engine around it (prompts, the running list, the batch,
// kernels that do nothing, a publisher that counts) and a main() that admits two waves of
// prompts sharing a prefix, steps until every request finished, forks a beam on the way,
// and checks the manager's invariants and what the loop reported. Cost: milliseconds.
#pragma once

#include <kvmm/manager/kernel_exports.hpp>
#include <kvmm/manager/kv_cache_manager.hpp>
#include <kvmm/manager/kv_events.hpp>
#include <kvmm/spec/presets.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <span>
#include <string>
#include <vector>

// Defined by the snippet.
extern kvmm::KVLayout layout;
extern kvmm::KVCacheManager kv;
struct Prompt;
bool admit(const Prompt& p, std::uint32_t budget);
void step();
kvmm::RequestId add_beam(kvmm::RequestId parent_id);

struct Prompt {
  std::vector<std::uint32_t> token_ids;
  std::uint32_t lora = 0;
  std::string tenant;
  std::uint64_t max_new = 0;
};

constexpr std::uint32_t kChunk = 48;  // prefill chunk: prompts take a few steps

// One running request, as the snippet builds it ({id, hit, n}); main() sets the rest.
struct Seq {
  kvmm::RequestId id;
  std::uint64_t hit = 0;
  std::uint32_t n = 0;
  std::uint64_t prompt = 0;   // prompt tokens
  std::uint64_t max_new = 0;  // tokens to generate
  std::uint64_t after = 0;    // tokens computed after this step
  bool done = false;

  bool prefilling() const { return kv.num_computed(id) < prompt; }
  std::uint32_t next_chunk() const {
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(prompt - kv.num_computed(id), kChunk));
  }
  std::uint64_t computed_after_step() {
    after = kvmm::KernelExports(kv).kv_len(id, 0);
    return after;
  }
  bool sampled() const { return after >= prompt; }  // the step reached the prompt's end
  std::uint32_t last_token() const { return static_cast<std::uint32_t>(after % 997); }
  bool finished() {
    done = kv.num_tokens(id) >= prompt + max_new;
    return done;
  }
};

struct Batch {
  std::vector<kvmm::RequestId> rows;
  void add(kvmm::RequestId id, std::uint32_t /*n*/) { rows.push_back(id); }
  std::span<const kvmm::RequestId> ids() const { return rows; }
};

struct Engine {
  std::uint64_t steps = 0, copies = 0, swaps = 0;
  void copy_device_to_host(std::span<const kvmm::PageCopy> plan) { swaps += plan.size(); }
  void copy_pages(std::span<const kvmm::PageCopy> c) { copies += c.size(); }
  void run(Batch& b) {
    ++steps;
    b.rows.clear();
  }
};

struct Publisher {
  std::uint64_t events = 0;
  void publish(const kvmm::KvEventBatch& b) { events += b.events.size(); }
};

std::vector<Seq> running, swapped;
std::deque<Seq> waiting;
Batch batch;
Engine engine;
Publisher publisher;
kvmm::KvEventBatch events;
std::vector<std::vector<std::int32_t>> indptr, indices, last_len;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "docs/manager.md scheduler loop: %s\n", what);
    std::exit(1);
  }
}

Prompt prompt(std::uint32_t salt_free_id, std::uint64_t tokens) {
  Prompt p{.token_ids = {}, .lora = 0, .tenant = "tenant-a", .max_new = 20};
  for (std::uint64_t t = 0; t < tokens; ++t)  // a shared 128-token system prompt, then the user's
    p.token_ids.push_back(t < 128 ? static_cast<std::uint32_t>(t)
                                  : salt_free_id * 1000 + static_cast<std::uint32_t>(t));
  return p;
}

// Admits p as the snippet does and completes the Seq it pushed.
bool admit_prompt(const Prompt& p) {
  if (!admit(p, kChunk)) return false;
  running.back().prompt = p.token_ids.size();
  running.back().max_new = p.max_new;
  return true;
}

void step_and_drop_finished() {
  step();
  check(swapped.empty() && waiting.empty(), "a request was preempted with memory to spare");
  std::erase_if(running, [](const Seq& s) { return s.done; });
}

}  // namespace

int main() {
  for (kvmm::GroupId g = 0; g < layout.num_groups(); ++g) {
    indptr.emplace_back(65);
    indices.emplace_back(64 * 256);
    last_len.emplace_back(64);
  }
  for (std::uint32_t i = 0; i < 4; ++i) check(admit_prompt(prompt(i, 200 + 10 * i)), "first wave refused");
  for (int i = 0; i < 3; ++i) step_and_drop_finished();
  // A beam of a request past its prompt shares its pages.
  Seq child = running.front();
  child.id = add_beam(child.id);
  running.push_back(child);
  while (!running.empty()) step_and_drop_finished();
  // The second wave shares the system prompt: its lookup finds it cached.
  check(admit_prompt(prompt(9, 300)), "second wave refused");
  check(running.back().hit >= 128, "the shared system prompt was not a hit");
  while (!running.empty()) step_and_drop_finished();
  kv.check_invariants();
  check(kv.num_active() == 0, "requests left active");
  check(engine.steps > 20, "too few steps ran");
  check(publisher.events > 0, "no KV events published");
  std::printf("steps %llu, copies %llu, events %llu\n", static_cast<unsigned long long>(engine.steps),
              static_cast<unsigned long long>(engine.copies), static_cast<unsigned long long>(publisher.events));
  return 0;
}
