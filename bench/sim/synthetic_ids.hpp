// What kvmm-sim hands the manager for a request's content: the token ids and image items of
// a workload request (SeqInfo). A trace with token ids gives its own (image positions get a
// placeholder id); otherwise ids come from (prefix stream, position) inside the shared
// prefix and (request, position) after it, so shared prefixes hash equal and nothing else
// does. Host code, O(tokens written); no state.
#pragma once

#include "sim/policy.hpp"

#include "kvmm/manager/kv_cache_manager.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::sim {

// Image k of a request: its decoder-token span (inlined images shift later text; with
// cross-attention the span sits at its text offset, pushed past the previous image so items
// never overlap). Its hash is the shared stream's (with its offset and length) when the
// prefix covers it. Appends to `items`.
void synthetic_items(const SeqInfo& info, bool cross, std::vector<MultimodalItem>& items);

// A token-id trace's decoder prompt: the text ids in order, each inlined image's span a
// placeholder id (the image's hash tells images apart). Appends to `out`.
void trace_prompt_ids(const std::vector<std::uint32_t>& text, std::span<const MultimodalItem> items, bool cross,
                      std::vector<std::uint32_t>& out);

// The ids of positions [from, n) written to the front of `out` (grown, never shrunk: no zero
// fill of a long prompt after a short feed): the trace's prompt ids, then the shared
// stream's up to the prefix's end, then the request's own stream.
std::span<const std::uint32_t> synthetic_ids(std::span<const std::uint32_t> prompt_ids, const SeqInfo& info,
                                             std::uint64_t from, std::uint64_t n, std::vector<std::uint32_t>& out);

}  // namespace kvmm::sim
