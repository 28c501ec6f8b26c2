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

CASES = [
    # (name, setup)
    ("sync-nocache-fcfs", Setup(num_blocks=48, caching=False)),
    ("sync-cache-fcfs", Setup(num_blocks=48, caching=True)),
    ("sync-nocache-priority", Setup(num_blocks=48, caching=False, policy="priority")),
    ("sync-cache-priority", Setup(num_blocks=48, caching=True, policy="priority")),
    ("sync-nocache-spec3", Setup(num_blocks=48, caching=False, spec_tokens=3)),
    ("sync-cache-spec3", Setup(num_blocks=48, caching=True, spec_tokens=3)),
    ("sync-nocache-swa", Setup(num_blocks=64, caching=False, window=32)),
    ("sync-nocache-swa-lazy", Setup(num_blocks=64, caching=False, window=32, commit_after_output=False)),
    ("sync-cache-swa", Setup(num_blocks=64, caching=True, window=32)),
    ("async-nocache-fcfs", Setup(num_blocks=48, caching=False, async_scheduling=True)),
    ("async-cache-fcfs", Setup(num_blocks=48, caching=True, async_scheduling=True)),
    ("async-cache-priority-swa", Setup(num_blocks=64, caching=True, policy="priority", window=32,
                                       async_scheduling=True)),
]


@pytest.mark.parametrize("name,setup", CASES, ids=[c[0] for c in CASES])
def test_differential(name, setup):
    seed = 7
    trace = make_trace(seed, num_requests=60)
    theirs = run(setup, trace, kvmm=False, seed=seed)
    ours = run(setup, trace, kvmm=True, seed=seed)
    want = expected_outputs(trace)
    assert theirs.outputs == want, "vLLM's own manager: wrong token streams (the harness is wrong)"
    assert ours.outputs == want
    print(f"{name}: steps vLLM {theirs.steps} kvmm {ours.steps}; preemptions {theirs.preemptions} / "
          f"{ours.preemptions}; admitted hit tokens {theirs.hit_tokens} / {ours.hit_tokens}")
    assert theirs.preemptions > 0, "the pool was meant to force preemption"
    if not setup.caching and (setup.window is None or not setup.commit_after_output):
        assert ours.schedule == theirs.schedule
