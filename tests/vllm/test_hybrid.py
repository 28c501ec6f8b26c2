"""A hybrid model through kvmm's own layout inside vLLM's scheduler: transformers' Qwen3-Next
(gated-DeltaNet linear attention + full attention; tiny, random weights, float64) computed
by hybrid_worker.py over an arena laid out as kvmm plans it (an LCM layout: two attention
pages per large page, one state page), vLLM's scheduler on KvmmLayoutScheduler. vLLM's
hybrid models put every group in one pool of equal pages; kvmm plans the LCM of the groups'
pages, and its state group keeps a checkpoint of the linear layers' state every 8 tokens
(prefix hits resume from one). Greedy tokens must equal transformers' generate, logits a
full forward within 1e-6; the pool is small enough to preempt, prompts share prefixes."""

import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec

from harness import Setup, make_scheduler, run
from hybrid_worker import HybridWorker
from test_models import VOCAB, trace

NUM_BLOCKS = 12  # large pages + vLLM's null block
CHECKPOINT = 8  # tokens per attention page and per state checkpoint


def tiny_qwen3_next():
    torch.manual_seed(0)
    cfg = Qwen3NextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=1, head_dim=16, linear_num_value_heads=4,
                          linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                          linear_conv_kernel_dim=4, max_position_embeddings=1024, attn_implementation="eager",
                          layer_types=["linear_attention", "full_attention"] * 2,
                          mlp_only_layers=[0, 1, 2, 3])  # dense MLPs: the MoE's grouped_mm has no float64
    return Qwen3NextForCausalLM(cfg).to(torch.float64).eval()


def kv_config(model) -> KVCacheConfig:
    """vLLM's groups: the full-attention layers, and the linear layers' state (MambaSpec, its
    block size the checkpoint interval; conv window [conv_dim, kernel] + recurrent matrix)."""
    lin = model.model.layers[0].linear_attn
    state = MambaSpec(block_size=CHECKPOINT, shapes=((lin.conv_dim, lin.conv_kernel_size),
                                                     (lin.num_v_heads, lin.head_k_dim, lin.head_v_dim)),
                      dtypes=(torch.float64, torch.float64), mamba_cache_mode="align")
    attn = FullAttentionSpec(block_size=CHECKPOINT, num_kv_heads=model.config.num_key_value_heads,
                             head_size=model.config.head_dim, dtype=torch.float64)
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["model.layers.1", "model.layers.3"], attn),
        KVCacheGroupSpec(["model.layers.0", "model.layers.2"], state)])


def test_qwen3_next_through_kvmm_layout():
    model = tiny_qwen3_next()
    setup = Setup(num_blocks=NUM_BLOCKS, block_size=CHECKPOINT, caching=True, max_num_seqs=8,
                  max_num_batched_tokens=48, max_model_len=512, kvmm_layout=True, mamba_cache_mode="align")
    # vLLM's "align" mode: the scheduler ends prefill chunks at state blocks (checkpoints).
    assert make_scheduler(setup, kvmm=True, kcc=kv_config(model)).need_mamba_block_aligned_split
    tr = trace(3, n=6, max_new=30)
    log = run(setup, tr, kvmm=True, kcc=kv_config(model), make_worker=lambda kcc: HybridWorker(model, kcc))
    layout = log.worker.layout
    assert [layout.small_pages_per_large_page(g) for g in range(2)] == [2, 1]  # an LCM layout
    print(f"qwen3-next: preemptions {log.preemptions}, admitted hit tokens {log.hit_tokens}, steps {log.steps}")
    assert log.preemptions > 0 and log.hit_tokens > 0
    worst = 0.0
    with torch.no_grad():
        for rid, prompt in tr.prompts.items():
            n = tr.max_tokens[rid]
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
            assert log.outputs[rid] == ref, rid
            logits = model(torch.tensor([prompt + ref[:-1]])).logits[0, len(prompt) - 1:]
            mine = torch.stack(log.worker.logits[rid][-len(ref):])
            worst = max(worst, (mine - logits).abs().max().item())
    print(f"qwen3-next: largest logit difference from a full forward: {worst}")
    assert worst < 1e-6
