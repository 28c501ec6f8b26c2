"""Differential scheduling: seeded traces (shared prefixes, a chunked-prefill budget, a pool
small enough to preempt, random draft acceptance) through vLLM's own scheduler, once with
vLLM's KV cache manager and once with kvmm's. Both must produce every request's true token
stream; the stand-in worker's block tables must equal the manager's on every held entry at
every step; with kvmm: check_invariants() every step, ids in [1, num_blocks), no id in two
groups or two unrelated requests, every page free at the end. With prefix caching off both
managers must schedule identically, step by step (same tokens, same preemptions); with it on,
kvmm's hits differ by design (it caches a page when its step's output is committed, vLLM when
the page is allocated, so vLLM may hit a page another request computes in the same step):
the hit and preemption counts are printed, not compared. With a sliding window kvmm releases
out-of-window pages when a step's output is committed, vLLM at the request's next allocation:
schedules match where the adapter commits as late as vLLM (commit_after_output=False)."""

import pytest

from harness import Setup, expected_outputs, make_trace, run

FEATURES = dict(loras=2, salts=True, images=True, num_prefixes=2)  # LoRA adapters, cache salts, images (make_trace)

EXAMPLE_CONNECTOR = dict(kv_connector="ExampleConnector", kv_role="kv_both")
UNCHUNKED = dict(chunked_prefill=False, max_num_batched_tokens=512, max_model_len=512)

CASES = [
    # (name, setup, make_trace's keywords)
    ("sync-nocache-fcfs", Setup(num_blocks=48, caching=False), {}),
    ("sync-cache-fcfs", Setup(num_blocks=48, caching=True), {}),
    ("sync-nocache-priority", Setup(num_blocks=48, caching=False, policy="priority"), {}),
    ("sync-cache-priority", Setup(num_blocks=48, caching=True, policy="priority"), {}),
    ("sync-nocache-spec3", Setup(num_blocks=48, caching=False, spec_tokens=3), {}),
    ("sync-cache-spec3", Setup(num_blocks=48, caching=True, spec_tokens=3), {}),
    ("sync-nocache-swa", Setup(num_blocks=64, caching=False, window=32), {}),
    ("sync-nocache-swa-lazy", Setup(num_blocks=64, caching=False, window=32, commit_after_output=False), {}),
    ("sync-cache-swa", Setup(num_blocks=64, caching=True, window=32), {}),
    ("async-nocache-fcfs", Setup(num_blocks=48, caching=False, async_scheduling=True), {}),
    ("async-cache-fcfs", Setup(num_blocks=48, caching=True, async_scheduling=True), {}),
    ("async-cache-priority-swa", Setup(num_blocks=64, caching=True, policy="priority", window=32,
                                       async_scheduling=True), {}),
    # Chunked local attention (Llama-4's layout: full + 64-token chunks).
    ("sync-nocache-chunked-lazy", Setup(num_blocks=48, caching=False, chunk=64, commit_after_output=False), {}),
    ("sync-cache-chunked", Setup(num_blocks=48, caching=True, chunk=64), {}),
    ("async-cache-chunked-swa", Setup(num_blocks=64, caching=True, chunk=64, window=32, async_scheduling=True), {}),
    # LoRA adapters (at most one per step), cache salts, images sharing placeholder ids.
    ("sync-nocache-lora-salt-mm", Setup(num_blocks=48, caching=False, max_loras=1, encoder_budget=256), FEATURES),
    ("sync-cache-lora-salt-mm", Setup(num_blocks=48, caching=True, max_loras=1, encoder_budget=256), FEATURES),
    ("async-cache-lora-salt-mm-swa", Setup(num_blocks=64, caching=True, max_loras=2, encoder_budget=256, window=32,
                                           async_scheduling=True), FEATURES),
    # Async scheduling with draft tokens, and the lookahead slots of EAGLE-like proposers.
    ("async-nocache-spec3", Setup(num_blocks=48, caching=False, spec_tokens=3, async_scheduling=True), {}),
    ("async-cache-spec3", Setup(num_blocks=48, caching=True, spec_tokens=3, async_scheduling=True), {}),
    ("sync-nocache-spec3-lookahead3", Setup(num_blocks=48, caching=False, spec_tokens=3, lookahead=3), {}),
    ("async-nocache-spec3-lookahead3", Setup(num_blocks=48, caching=False, spec_tokens=3, lookahead=3,
                                             async_scheduling=True), {}),
    ("async-cache-spec3-lookahead3-swa-mm", Setup(num_blocks=64, caching=True, spec_tokens=3, lookahead=3, window=32,
                                                  async_scheduling=True, encoder_budget=256),
     FEATURES | dict(loras=0)),
    # A caller's cap on every hit (vLLM's max_cache_hit_length): tokens - 1 - (0..63).
    ("sync-cache-cap", Setup(num_blocks=48, caching=True, hit_cap=64), {}),
    ("async-cache-cap-swa-lora-salt-mm", Setup(num_blocks=48, caching=True, hit_cap=64, window=32, max_loras=1,
                                               encoder_budget=256, async_scheduling=True), FEATURES),
    # vLLM's watermark: admissions leave 4 blocks free (2 a group with a window: as vLLM's count).
    ("sync-nocache-watermark", Setup(num_blocks=48, caching=False, watermark=0.09), {}),
    ("sync-nocache-swa-lazy-watermark", Setup(num_blocks=48, caching=False, window=32, commit_after_output=False,
                                              watermark=0.09), {}),
    ("async-cache-spec3-watermark", Setup(num_blocks=48, caching=True, spec_tokens=3, async_scheduling=True,
                                          watermark=0.09), {}),
    # vLLM's ExampleConnector (a KV store on disk; synchronous loads of a stored prompt's
    # tokens beyond the local hit), its worker side in connector_io.py. It stores a prompt's
    # blocks of its first step only, so prompts are not chunked here.
    ("sync-nocache-connector", Setup(num_blocks=48, caching=False, kv_transfer=EXAMPLE_CONNECTOR, **UNCHUNKED), {}),
    ("sync-cache-connector-mm", Setup(num_blocks=48, caching=True, kv_transfer=EXAMPLE_CONNECTOR, encoder_budget=256,
                                      **UNCHUNKED), dict(images=True, num_prefixes=2)),
]


def must_schedule_alike(setup: Setup) -> bool:
    """Prefix caching off, and local groups (window, chunks) releasing pages when vLLM does."""
    return not setup.caching and ((setup.window is None and setup.chunk is None) or not setup.commit_after_output)


@pytest.mark.parametrize("name,setup,trace_kw", CASES, ids=[c[0] for c in CASES])
def test_differential(name, setup, trace_kw):
    seed = 7
    trace = make_trace(seed, num_requests=60, **trace_kw)
    theirs = run(setup, trace, kvmm=False, seed=seed)
    ours = run(setup, trace, kvmm=True, seed=seed)
    want = expected_outputs(trace)
    assert theirs.outputs == want, "vLLM's own manager: wrong token streams (the harness is wrong)"
    assert ours.outputs == want
    print(f"{name}: steps vLLM {theirs.steps} kvmm {ours.steps}; preemptions {theirs.preemptions} / "
          f"{ours.preemptions}; admitted hit tokens {theirs.hit_tokens} / {ours.hit_tokens}; "
          f"same schedule: {ours.schedule == theirs.schedule}")
    # (the watermark is there to avoid preemption: with a window it avoids all of them here)
    assert theirs.preemptions > 0 or setup.watermark, "the pool was meant to force preemption"
    if setup.caching:
        assert ours.hit_tokens > 0 and theirs.hit_tokens > 0, "the trace was meant to hit"
    if setup.kv_transfer:
        print(f"{name}: tokens loaded by the connector: vLLM {theirs.worker.store.loads} kvmm {ours.worker.store.loads}")
        assert ours.worker.store.loads > 0 and theirs.worker.store.loads > 0, "the trace was meant to load"
    if must_schedule_alike(setup):
        assert ours.schedule == theirs.schedule


def test_content_check_catches_a_wrong_image_key(monkeypatch):
    """The block-content check (kv_content.py) can fail: kvmm told that every image is the
    same one shares pages across images with equal placeholder ids, and the run fails."""
    import kvmm.integrations.vllm as adapter

    monkeypatch.setattr(adapter, "_item_hash", lambda identifier: 1)
    trace = make_trace(7, num_requests=60, images=True)
    with pytest.raises(AssertionError, match="another context|other LoRA, salt or image"):
        run(Setup(num_blocks=48, caching=True, encoder_budget=256), trace, kvmm=True, seed=7)
