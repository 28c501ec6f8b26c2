#!/usr/bin/env python3
"""Times torch.nn.functional.scaled_dot_product_attention on bench_kernels' decode shapes
(Llama-3-8B: 32 query heads, 8 kv heads, head_dim 128, bf16, contiguous KV) next to a
device-to-device copy measured in the same run, so that its KV GB/s sits beside kvmm's;
then on its prefill shapes (one request, a chunk of new tokens at the end of the context,
causal aligned to the context's end: torch's causal_lower_right), in TFLOP/s counted as
bench_kernels counts them (4 flops per query head, visible key and dim). For prefill K/V are
expanded to the 32 query heads before timing (the bias path takes no enable_gqa): the
product's flops are the same, its K/V reads 4x, which a compute-bound shape hides.
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
    prefill(dev)


def prefill(dev):
    from torch.nn.attention.bias import causal_lower_right

    print()
    print("| prefill chunk | ctx | sdpa us | TFLOP/s |")
    print("| --- | --- | --- | --- |")
    for chunk in (512, 2048):
        for ctx in (2048, 8192):
            q = torch.randn(1, 32, chunk, 128, dtype=torch.bfloat16, device=dev)
            k = torch.randn(1, 32, ctx, 128, dtype=torch.bfloat16, device=dev)
            v = torch.randn_like(k)
            bias = causal_lower_right(chunk, ctx)
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
            keys = chunk * (ctx - chunk) + chunk * (chunk + 1) / 2
            print(f"| {chunk} | {ctx} | {ms * 1e3:.0f} | {4.0 * keys * 32 * 128 / (ms * 1e-3) / 1e12:.1f} |")


if __name__ == "__main__":
    main()
