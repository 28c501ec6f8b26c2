"""vLLM's scheduler step (schedule() + update_from_output()) with vLLM's own KV cache manager
against kvmm's (kvmm.integrations.vllm), at N running decode requests. Interleaved: both
schedulers are brought to steady decode, then timed in alternating rounds of STEPS steps;
the stand-in worker (tests/vllm/harness.py) runs outside the timed region. Thread CPU time
(the shared machine disturbs it less than wall time). Prints a
markdown table (median and min microseconds per step over the rounds).

    $(scripts/vllm_env.sh --python) bench/python/vllm_step.py [--requests 64 256] [--rounds 7]
"""

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "vllm"))

from harness import Setup, Worker, make_scheduler, sha256, get_request_block_hasher  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.request import Request  # noqa: E402


def steady(n: int, kvmm: bool, window):
    prompt, block = 512, 16
    blocks = n * (prompt + 2048) // block + 64
    setup = Setup(num_blocks=blocks, block_size=block, window=window, caching=True, max_num_seqs=n,
                  max_num_batched_tokens=8192, max_model_len=4096)
    sched = make_scheduler(setup, kvmm)
    hasher = get_request_block_hasher(block, sha256)
    for i in range(n):
        toks = [(i * 7919 + j) % 997 for j in range(prompt)]
        sched.add_request(Request(request_id=f"b{i}", prompt_token_ids=toks, pooling_params=None,
                                  sampling_params=SamplingParams(max_tokens=3000, ignore_eos=True),
                                  arrival_time=0.0, block_hasher=hasher))
    worker = Worker(len(sched.kv_cache_config.kv_cache_groups), 0, 0)
    for _ in range(200):  # until every request decodes
        out = sched.schedule()
        mro, _ = worker.execute(out)
        sched.update_from_output(out, mro)
        if len(out.num_scheduled_tokens) == n and all(v == 1 for v in out.num_scheduled_tokens.values()):
            break
    return sched, worker


def timed(sched, worker, steps: int) -> float:
    total = 0.0
    for _ in range(steps):
        t0 = time.thread_time()
        out = sched.schedule()
        t1 = time.thread_time()
        mro, _ = worker.execute(out)
        t2 = time.thread_time()
        sched.update_from_output(out, mro)
        t3 = time.thread_time()
        total += (t1 - t0) + (t3 - t2)
    return total / steps * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    print("| layout | running requests | vLLM's manager us/step (median, min) | kvmm us/step (median, min) | kvmm / vLLM |")
    print("| --- | --- | --- | --- | --- |")
    for window, name in ((None, "full attention"), (256, "full + sliding window 256")):
        for n in args.requests:
            runs = {False: steady(n, False, window), True: steady(n, True, window)}
            times = {False: [], True: []}
            for _ in range(args.rounds):
                for kv in (False, True):
                    times[kv].append(timed(*runs[kv], args.steps))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"| {name} | {n} | {med[False]:.0f} ({min(times[False]):.0f}) | {med[True]:.0f} "
                  f"({min(times[True]):.0f}) | {med[True] / med[False]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
