// Speculative decoding in kvmm-sim's kvmm policy: the engine's side of draft tokens
// (per-verified-position state tags, draft positions recomputed at admission) and
// vLLM's rules for EAGLE/MTP that the vllm-eagle policy runs on kvmm's manager (draft
// groups cached as plain groups, the last block of every hit dropped). Each call is
// O(groups), but the capped lookup, which is a second lookup_prefix.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvmm::sim {

// The layout with every draft role removed: draft groups become plain groups, cached
// like the target's and part of every hit (vLLM's KV cache groups).
KVLayout without_draft_roles(const KVLayout& layout);

// vLLM's block (the last one a hit drops): the target attention groups' page at the
// tokens per page asked for (vLLM's block size, whatever kvmm's planner fitted).
std::uint64_t vllm_block_tokens(const KVLayout& layout);

// vLLM with EAGLE drops the last block of every hit: given request r's hit, resets r and
// looks up again capped one block short of the whole blocks hit (a hybrid falls back to
// its checkpoint below the cap). Returns the new hit; a hit of 0 is returned as is.
std::uint32_t vllm_eagle_hit(KVCacheManager& kv, RequestId r, std::uint32_t hit, std::uint64_t block_tokens);

// Draft positions the engine recomputes at r's admission, over every draft group.
std::uint64_t draft_recompute_tokens(const KVCacheManager& kv, RequestId r);

// The engine keeps the state after each verified position of a step (per-draft-position
// states, as speculative engines for hybrids do) and tags the last checkpoint the
// verified tokens crossed, once: KVCacheManager::tag_state refuses anything else.
// tagged: per group, the last state count tagged (resized to the layout's groups).
void tag_verified_states(KVCacheManager& kv, RequestId r, std::vector<std::uint64_t>& tagged, std::uint64_t verified);

// The prefix describe() puts before the kvmm description for vllm-eagle.
std::string_view vllm_eagle_description();

}  // namespace kvmm::sim
