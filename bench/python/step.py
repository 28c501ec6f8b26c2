#!/usr/bin/env python3
"""kvmm from Python: the cost of a scheduler's KV calls through the bindings.

decode step: 256 running requests (2048-token prompts; full attention + sliding window
1024, 16-token pages), per step append + allocate(1) per request, CSR export of both
groups into int32 arrays (FlashInfer plan() input) and commit: as batch calls (caller's
arrays, or arrays the package allocates), with the incremental dense export instead
(FlashAttention's block table, only changed entries written), as one decode_step call
(commit + append + allocate + the incremental export of both groups, one crossing), and as
one call per request. lookup: add_request + lookup_prefix + allocate(r, 0) of a cached
128k-token prompt (free untimed). The C++ twins: bench/python/python_twin.cpp (the step),
bench/manager_lookup.cpp BM_LookupCached128k/1. Medians over every timed step / lookup.
Usage: step.py BUILD_DIR [--quick] [--modes=a,b,...] [--no-lookup]; modes the package
lacks (an older build) are skipped.
"""
import statistics
import sys
import time

sys.path.insert(0, f"{sys.argv[1] if len(sys.argv) > 1 else 'build/release'}/python")
import numpy as np  # noqa: E402

import kvmm  # noqa: E402

BATCH, PROMPT, MAX_DECODE = 256, 2048, 2048
QUICK = "--quick" in sys.argv


def layout():
    return kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("global", 23, 16, 128, 2, 16),
                               kvmm.LayerGroup.sliding_window("local", 23, 16, 128, 2, 16, 1024)])


class Wave:
    def __init__(self):
        self.kv = kvmm.KVCacheManager(layout(), num_large_pages=BATCH * (256 + 80), max_requests=BATCH)
        self.wave = 0
        self.ids = None

    def start(self):
        kv = self.kv
        if self.ids is not None:
            for r in self.ids:
                kv.free(int(r))
        self.wave += 1
        kv.begin_step()
        ids = []
        for i in range(BATCH):
            prompt = (np.arange(PROMPT, dtype=np.uint64) + self.wave * 7919 + i * 104729).astype(np.uint32)
            r = kv.add_request(prompt, max_tokens=PROMPT + MAX_DECODE)
            kv.lookup_prefix(r)
            assert kv.allocate(r, PROMPT)
            kv.commit(r, PROMPT)
            ids.append(r)
        self.ids = np.array(ids, np.uint32)


def run_steps(w, step, n):
    """Times n steps (a new wave, untimed, whenever the requests reach full length): wall
    and thread CPU time per step (the CPU time is what a shared machine leaves intact)."""
    wall, cpu = [], []
    s = 0
    for _ in range(n):
        if s == MAX_DECODE:
            w.start()
            s = 0
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        step(s)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
        s += 1
    return wall, cpu


def bench_step(mode):
    w = Wave()
    kv = w.kv
    indptr = np.zeros(BATCH + 1, np.int32)
    indices = np.zeros(BATCH * (PROMPT + MAX_DECODE) // 16, np.int32)
    last = np.zeros(BATCH, np.int32)
    toks = np.zeros(BATCH, np.uint32)

    def batched(s):
        kv.begin_step()
        toks.fill(s)
        kv.append_batch(w.ids, toks)
        if kv.allocate_batch(w.ids, 1) != BATCH:
            raise RuntimeError("decode allocation refused")
        kv.export_csr(0, w.ids, indptr, indices, last)
        kv.export_csr(1, w.ids, indptr, indices, last)
        kv.commit_batch(w.ids)

    def batched_no_export(s):
        kv.begin_step()
        toks.fill(s)
        kv.append_batch(w.ids, toks)
        if kv.allocate_batch(w.ids, 1) != BATCH:
            raise RuntimeError("decode allocation refused")
        kv.commit_batch(w.ids)

    def batched_owned(s):
        kv.begin_step()
        toks.fill(s)
        kv.append_batch(w.ids, toks)
        if kv.allocate_batch(w.ids, 1) != BATCH:
            raise RuntimeError("decode allocation refused")
        kv.export_csr(0, w.ids)  # new package Buffers, numpy views
        kv.export_csr(1, w.ids)
        kv.commit_batch(w.ids)

    max_pages = (PROMPT + MAX_DECODE) // 16
    tables = [np.zeros((BATCH, max_pages), np.int32) for _ in range(2)]

    def batched_dense_incremental(s):
        kv.begin_step()
        toks.fill(s)
        kv.append_batch(w.ids, toks)
        if kv.allocate_batch(w.ids, 1) != BATCH:
            raise RuntimeError("decode allocation refused")
        kv.export_dense_incremental(0, w.ids, tables[0], null_page=0)  # a decode step: ~1 entry per row
        kv.export_dense_incremental(1, w.ids, tables[1], null_page=0)
        kv.commit_batch(w.ids)

    def decode_step(s):  # the fused call: commit (of the previous step) + append + allocate + export
        kv.begin_step()
        toks.fill(s)
        if kv.decode_step(w.ids, toks, tables, null_page=0) != BATCH:
            raise RuntimeError("decode allocation refused")

    ids_list = None

    def per_request(s):
        kv.begin_step()
        for r in ids_list:
            kv.append_token(r, s)
            if not kv.allocate(r, 1):
                raise RuntimeError("decode allocation refused")
        kv.export_csr(0, w.ids, indptr, indices, last)
        kv.export_csr(1, w.ids, indptr, indices, last)
        for r in ids_list:
            kv.commit(r, kv.num_computed(r) + 1)

    step = {"batched": batched, "batched_no_export": batched_no_export, "batched_owned": batched_owned,
            "batched_dense_incremental": batched_dense_incremental, "decode_step": decode_step,
            "per_request": per_request}[mode]
    w.start()
    run_steps(w, batched, 256 if QUICK else MAX_DECODE)  # warm-up: rows sized (steady state)
    w.start()
    ids_list = [int(r) for r in w.ids]
    wall, cpu = run_steps(w, step, 256 if QUICK else MAX_DECODE)
    return statistics.median(wall) / 1e3, statistics.median(cpu) / 1e3, statistics.mean(cpu) / 1e3


def bench_lookup():
    kv = kvmm.KVCacheManager(kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("global", 32, 8, 128, 2, 16)]),
                             num_large_pages=2 * (128 * 1024 // 16 + 16), max_requests=4)
    tokens = (np.arange(128 * 1024, dtype=np.uint64) * 2654435761 % 2 ** 32).astype(np.uint32)
    kv.begin_step()
    warm = kv.add_request(tokens)
    kv.lookup_prefix(warm)
    assert kv.allocate(warm, len(tokens))
    kv.commit(warm, len(tokens))
    kv.free(warm)
    wall, cpu = [], []
    for _ in range(50 if QUICK else 1000):
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        r = kv.add_request(tokens)
        hit = kv.lookup_prefix(r)
        ok = kv.allocate(r, 0)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
        assert ok and hit == len(tokens) - 16
        kv.free(r)
    return statistics.median(wall) / 1e3, statistics.median(cpu) / 1e3, statistics.mean(cpu) / 1e3


def main():
    print(f"kvmm {kvmm.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    print("per step: median wall us, median CPU us, mean CPU us (Google Benchmark's statistic), "
          "mean CPU ns per request")
    modes = ("batched", "batched_no_export", "batched_dense_incremental", "decode_step", "batched_owned",
             "per_request")
    for arg in sys.argv:
        if arg.startswith("--modes="):
            modes = arg[len("--modes="):].split(",")
    for mode in modes:
        if mode == "decode_step" and not hasattr(kvmm.KVCacheManager, "decode_step"):
            print(f"decode step {mode:18s}: not in this build, skipped")
            continue
        wall, cpu, mean = bench_step(mode)
        print(f"decode step {mode:18s} batch {BATCH}: wall {wall:8.2f} us  cpu {cpu:8.2f} us  mean {mean:8.2f} us  "
              f"{mean * 1e3 / BATCH:7.1f} ns/request  median {cpu * 1e3 / BATCH:6.1f} ns/request")
    if "--no-lookup" in sys.argv:
        return
    wall, cpu, mean = bench_lookup()
    print(f"lookup 128k (add_request + lookup_prefix + allocate(r, 0)): wall {wall:8.1f} us  cpu {cpu:8.1f} us  "
          f"mean {mean:8.1f} us")


if __name__ == "__main__":
    main()
