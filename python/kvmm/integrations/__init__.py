"""kvmm inside other engines. `kvmm.integrations.vllm` (imported on its own, only where vLLM
is installed) runs vLLM's own scheduler on kvmm's KVCacheManager: docs/vllm.md."""
