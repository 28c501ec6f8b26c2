"""Real model code under vLLM's scheduler: tiny randomly initialised transformers models
(Llama, Qwen2, Gemma-2 with soft-capping, Gemma-3 text; float64) computed by
tests/vllm/model_worker.py through the paged K/V that the block ids index, with vLLM's own
KV cache manager and with kvmm's. Greedy tokens must equal transformers' generate (its own
cache) and each other, and the worker's logits a full forward pass of each final sequence
within 1e-6 (transformers' eager attention takes its softmax in float32: the differences
measured are 2e-8 to 8e-8); a small pool forces preemption (recompute) in both runs, prompts
share prefixes (hits), and Gemma's sliding window (8 tokens) is shorter than most prompts."""

import random

import pytest
import torch

from harness import Setup, Trace, run
from model_worker import ModelWorker
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

VOCAB = 512
WINDOW = 8  # shorter than most prompts


def tiny(arch: str):
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, attn_implementation="eager")
    if arch == "llama":
        from transformers import LlamaConfig as C, LlamaForCausalLM as M

        cfg = C(num_hidden_layers=2, **common)
    elif arch == "qwen2":
        from transformers import Qwen2Config as C, Qwen2ForCausalLM as M

        cfg = C(num_hidden_layers=2, **common)
    elif arch == "gemma2":
        from transformers import Gemma2Config as C, Gemma2ForCausalLM as M

        cfg = C(num_hidden_layers=2, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                query_pre_attn_scalar=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, **common)
    elif arch == "gemma3":
        from transformers import Gemma3ForCausalLM as M, Gemma3TextConfig as C

        cfg = C(num_hidden_layers=2, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                query_pre_attn_scalar=16, **common)
    else:
        raise ValueError(arch)
    model = M(cfg).to(torch.float64).eval()
    return model


def kv_config(model, num_blocks: int, block_size: int) -> KVCacheConfig:
    """vLLM's groups for the model: full-attention layers, and sliding-window layers (Gemma)."""
    cfg = model.config
    kw = dict(block_size=block_size, num_kv_heads=cfg.num_key_value_heads, head_size=cfg.head_dim, dtype=torch.float64)
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    groups = []
    for kind in ("full_attention", "sliding_attention"):
        names = [f"model.layers.{i}" for i, t in enumerate(types) if t == kind]
        if not names:
            continue
        spec = FullAttentionSpec(**kw) if kind == "full_attention" else SlidingWindowSpec(sliding_window=cfg.sliding_window, **kw)
        groups.append(KVCacheGroupSpec(names, spec))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def trace(seed: int, n: int = 12, max_new: int = 16) -> Trace:
    rng = random.Random(seed)
    shared = [rng.randrange(VOCAB) for _ in range(24)]
    t = Trace({}, {}, {}, {})
    for i in range(n):
        rid = f"m{i}"
        head = shared[: rng.randrange(8, 25)] if rng.random() < 0.6 else []
        t.prompts[rid] = head + [rng.randrange(VOCAB) for _ in range(rng.randrange(2, 30))]
        t.max_tokens[rid] = rng.randrange(4, max_new)
        t.arrival_step[rid] = i // 3
        t.priority[rid] = 0
    return t


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "gemma3"])
def test_greedy_tokens_match_transformers(arch):
    model = tiny(arch)
    block_size = 4
    num_blocks = 40 if arch in ("llama", "qwen2") else 26  # small enough to preempt on both managers
    setup = Setup(num_blocks=num_blocks, block_size=block_size, caching=True, max_num_seqs=8,
                  max_num_batched_tokens=48, max_model_len=512)
    tr = trace(3, max_new=16 if arch in ("llama", "qwen2") else 40)  # long answers: decode outgrows the pool
    logs = {}
    for use_kvmm in (False, True):
        logs[use_kvmm] = run(setup, tr, kvmm=use_kvmm, kcc=kv_config(model, num_blocks, block_size),
                             make_worker=lambda kcc: ModelWorker(model, kcc, num_blocks))
    assert logs[False].outputs == logs[True].outputs
    assert logs[True].preemptions > 0 and logs[False].preemptions > 0
    print(f"{arch}: preemptions vLLM {logs[False].preemptions} kvmm {logs[True].preemptions}; "
          f"hit tokens {logs[False].hit_tokens} / {logs[True].hit_tokens}")
    worst = {"vLLM": 0.0, "kvmm": 0.0}
    with torch.no_grad():
        for rid, prompt in tr.prompts.items():
            ids = torch.tensor([prompt])
            ref = model.generate(ids, max_new_tokens=tr.max_tokens[rid], do_sample=False, min_new_tokens=tr.max_tokens[rid],
                                 pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
            assert logs[True].outputs[rid] == ref, rid
            full = torch.tensor([prompt + ref[:-1]])
            logits = model(full).logits[0, len(prompt) - 1:]
            for name, log in (("vLLM", logs[False]), ("kvmm", logs[True])):
                mine = torch.stack(log.worker.logits[rid][-len(ref):])
                err = (mine - logits).abs().max().item()
                worst[name] = max(worst[name], err)
                assert err < 1e-6, f"{name} {rid}: logits differ by {err}"
    print(f"{arch}: largest logit difference from a full forward: {worst}")
