"""Admitted prefix-hit tokens of vLLM's scheduler with vLLM's own KV cache manager and with
kvmm's, on a shared-prefix workload (a system prompt + short questions, answers of 50-100
tokens) with Gemma-2's layout (full attention + sliding window, equal pages), through the
stand-in worker of tests/vllm/harness.py. Prints a markdown table.

    $(scripts/vllm_env.sh --python) bench/python/vllm_hits.py [--requests 200] [--blocks 400 800]
"""

import argparse
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "vllm"))

from harness import Setup, Trace, run  # noqa: E402


def workload(seed: int, n: int, system: int) -> Trace:
    rng = random.Random(seed)
    prefix = [rng.randrange(998) for _ in range(system)]
    t = Trace({}, {}, {}, {})
    for i in range(n):
        rid = f"q{i}"
        t.prompts[rid] = prefix + [rng.randrange(998) for _ in range(rng.randrange(16, 65))]
        t.max_tokens[rid] = rng.randrange(50, 101)
        t.arrival_step[rid] = i * 2
        t.priority[rid] = 0
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--system", type=int, default=1024)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--blocks", type=int, nargs="+", default=[400, 800])
    args = ap.parse_args()
    tr = workload(1, args.requests, args.system)
    prompt_tokens = sum(len(p) for p in tr.prompts.values())
    print("| blocks (16 tokens) | manager | admitted hit tokens | of prompt tokens | preemptions | steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for blocks in args.blocks:
        setup = Setup(num_blocks=blocks, block_size=16, window=args.window, caching=True, max_num_seqs=32,
                      max_num_batched_tokens=2048, max_model_len=4096)
        for kvmm, name in ((False, "vLLM"), (True, "kvmm")):
            log = run(setup, tr, kvmm=kvmm, check=False)
            print(f"| {blocks} | {name} | {log.hit_tokens} | {log.hit_tokens / prompt_tokens:.1%} | "
                  f"{log.preemptions} | {log.steps} |", flush=True)


if __name__ == "__main__":
    main()
