#!/usr/bin/env python3
# What KVCacheManagerOptions::miss_reasons costs on the lookup path: add_request + lookup_prefix + allocate(r, 0) of a
# cached 128k-token prompt (16-token pages), full attention and full + window 4096, with the
# reasons off and on (65,536 slots), interleaved; median of per-round medians. Prints the
# markdown rows of docs/results/manager-miss-reasons.md.  bench/python/miss_reasons_cost.py [BUILD_DIR]
import statistics, sys, time
sys.path.insert(0, f"{sys.argv[1] if len(sys.argv) > 1 else 'build/release'}/python")
import numpy as np
import kvmm

T = 128 * 1024
tokens = (np.arange(T, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)

def make(groups, reasons):
    lay = kvmm.KVLayout.plan(groups)
    kv = kvmm.KVCacheManager(lay, num_large_pages=2 * (T // 16 + 16), max_requests=4, miss_reasons=reasons)
    kv.begin_step()
    r = kv.add_request(tokens)
    kv.lookup_prefix(r)
    assert kv.allocate(r, T)
    kv.commit(r, T)
    kv.free(r)
    return kv

def once(kv):
    t0 = time.perf_counter()
    r = kv.add_request(tokens)
    h = kv.lookup_prefix(r)
    assert kv.allocate(r, 0)
    t1 = time.perf_counter()
    kv.free(r)
    assert h == T - 16
    return (t1 - t0) * 1e6

for name, groups in [("full attention", [kvmm.LayerGroup.full_attention("g", 32, 8, 128, 2, 16)]),
                     ("full + window 4096", [kvmm.LayerGroup.full_attention("g", 32, 8, 128, 2, 16),
                                             kvmm.LayerGroup.sliding_window("l", 32, 8, 128, 2, 16, 4096)])]:
    off, on = make(groups, 0), make(groups, 1 << 16)
    a, b = [], []
    for rnd in range(15):
        pair = [(off, a), (on, b)] if rnd % 2 == 0 else [(on, b), (off, a)]
        for kv, acc in pair:
            acc.append(statistics.median(once(kv) for _ in range(9)))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {name} | {ma:.0f} | {mb:.0f} | {mb / ma:.3f} |")
