#!/usr/bin/env python3
"""Times torch.nn.functional.scaled_dot_product_attention on bench_kernels' decode shapes
(Llama-3-8B: 32 query heads, 8 kv heads, head_dim 128, bf16, contiguous KV) next to a
device-to-device copy measured in the same run, so that its KV GB/s sits beside kvmm's.
Needs a GPU and torch (>= 2.5 for enable_gqa; older versions time expanded K/V).
Usage: python3 bench/kernels/sdpa_bench.py   (medians of 20 runs, CUDA events)"""
import torch
import torch.nn.functional as F


def median_ms(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def sdpa(q, k, v):
    try:
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # probes the keyword
        return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except TypeError:  # pragma: no cover - torch < 2.5
        group = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return lambda: F.scaled_dot_product_attention(q, ke, ve)


def main():
    dev = torch.device("cuda")
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy_gbps = 2 * a.numel() / median_ms(lambda: b.copy_(a)) / 1e6
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; copy {copy_gbps:.0f} GB/s (read + written)")
    print("| batch | ctx | sdpa us | KV GB/s | fraction of copy |")
    print("| --- | --- | --- | --- | --- |")
    for batch in (1, 16, 64, 256):
        for ctx in (1024, 4096, 32768):
            if batch * ctx > (2 << 20):  # the memory budget of bench_kernels
                continue
            q = torch.randn(batch, 32, 1, 128, dtype=torch.bfloat16, device=dev)
            k = torch.randn(batch, 8, ctx, 128, dtype=torch.bfloat16, device=dev)
            v = torch.randn_like(k)
            ms = median_ms(sdpa(q, k, v))
            gbps = 2 * k.numel() * 2 / ms / 1e6
            print(f"| {batch} | {ctx} | {ms * 1e3:.1f} | {gbps:.0f} | {gbps / copy_gbps:.2f} |")


if __name__ == "__main__":
    main()
