#!/usr/bin/env python3
"""SASS census and resource checks of kvmm's compiled kernels (sm_80/sm_90).

Reads `cuobjdump -res-usage` (registers, stack frame, shared memory: what ptxas -v
reports) and `cuobjdump -sass` of the given objects, libraries or executables, and per
kernel and architecture counts instructions by class: global loads by width, HMMA, LDSM,
LDGSTS, SHFL, MUFU, local memory (LDL/STL: spills), in the whole kernel and in its main
loop (the span of the widest backward branch before the last EXIT). A listing shows an
inner loop's body once however many trips it runs, so a backward branch inside the main
loop fails --check unless the kernel's LIMITS row declares its trips (inner_trips), and
then the census multiplies its body by them. --check asserts the
per-kernel limits of LIMITS below; --json writes the census for the time model
(model.py). Costs one
cuobjdump pass per file (seconds); nothing is compiled.

  python3 bench/kernels/census.py [--check] [--json out.json] [--venv DIR] FILE...
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict

# Per-kernel limits: (name regex, arch regex, limits). Every kernel must match one row.
# regs: max registers; stack: max stack frame bytes; local_in_loop: LDL/STL allowed in the
# main loop; local: LDL/STL allowed anywhere; smem: max shared bytes as cuobjdump reports them
# (on sm_90 that includes the 1 KiB per CTA the system reserves); need: opcode
# classes that must be present; kv_loads_128: the main loop loads K/V 16 bytes wide
# (LDG.128 >= 8) and its narrow loads are page ids only (<= 4); loop_per_byte: the main
# loop's static instruction count per K/V byte its 16-byte cp.async copy is at most this;
# inner_trips: the trip count of each inner loop of the main loop (a backward branch inside it),
# in address order, which the loop counts are multiplied by; an inner loop without one fails
# --check (today no counted loop has one: the loops they had, such as the prefill's K/V copy,
# are unrolled).
LIMITS = [
    # Today's decode kernel (G 4) on sm_80: capped at 128 registers by __launch_bounds__(128, 4)
    # it spills 4-8 bytes outside the main loop (nvcc 13.0): named, bounded, kept out of the loop.
    (r"attention_kernel.*Li4E", r"sm_80", dict(regs=128, stack=8, local=4, local_in_loop=0, smem=17000, kv_loads_128=True)),
    (r"attention_kernel.*Li4E", r"sm_9", dict(regs=128, stack=0, local=0, local_in_loop=0, smem=18000, kv_loads_128=True)),
    (r"attention_kernel.*Li8E", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=35000, kv_loads_128=True)),
    (r"merge_kernel|write_kv_kernel|copy_pages_kernel|swap_pages", r"sm_", dict(regs=64, stack=0, local=0, smem=1024)),
    # The tensor-core decode (tc_decode.cuh, issue 36): K/V through 16-byte cp.async only,
    # HMMA and LDSM present, no local memory, at most 128 registers (__launch_bounds__(128,
    # 4); Q is read from shared memory by ldmatrix, not held in registers).
    # At D 256 O alone takes 128 registers per lane: up to 255 (one CTA per SM). The bf16
    # instances keep frames of 8-16 bytes (up to 3 LDL and 3 STL, outside the loop, nvcc
    # 13.0; the in-kernel split merge added one to sm_90's contiguous instance): named and
    # bounded here.
    (r"tc_decode_kernel.*Li256E", r"sm_", dict(regs=255, stack=16, local=6, local_in_loop=0, smem=2048,
                                               need=["HMMA", "LDSM", "LDGSTS.128"], cp_async_only=True)),
    # The 3-stage ring's sm_90 instances keep an 8-byte frame (1 LDL, 1 STL, outside the
    # loop, nvcc 13.0): named and bounded here.
    (r"tc_decode_kernel.*ELi3ELb0ELi1EEEv", r"sm_9", dict(regs=128, stack=8, local=2, local_in_loop=0, smem=2048,
                                                  need=["HMMA", "LDSM", "LDGSTS.128"], cp_async_only=True)),
    # Its swapped-operand form with 32-token warp tiles (kSwap, kSub 2, 2 stages: what the
    # launchers run at groups of at most 8, D 64 and 128): MOVM (P^T into B) present too. The
    # benchmarks' path (census variants, no soft cap, D 128): at most 0.03 main-loop
    # instructions per K/V byte, no stack. The shipped D 128 instances, with the runtime
    # soft-cap branch, keep an 8-byte frame (1 LDL, 1 STL, outside the loop, nvcc 13.0).
    (r"^nocap:.*tc_decode_kernel.*Li128E.*ELi2ELb1ELi2EEEv", r"sm_",
     dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048, loop_per_byte=0.03,
          need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128", "MOVM"], cp_async_only=True)),
    (r"tc_decode_kernel.*Li128E.*ELi2ELb1ELi2EEEv", r"sm_",
     dict(regs=128, stack=8, local=2, local_in_loop=0, smem=2048,
          need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128", "MOVM"], cp_async_only=True)),
    # Head dim 64 runs 64-token warp tiles (kSub 4, "Li4EEEv"): the sub-tiles' page ids spread
    # over the lanes (one lookup per lane and tile, offsets through shared memory). The census
    # variants (no soft cap): the main loop (two warp tiles, unrolled over the stages) holds 96
    # HMMA, 64 LDSM and 64 LDGSTS.128 (per 16 tokens 12, 8 and 8) and at most 0.03 instructions
    # per K/V byte where pages hold whole sub-tiles (16-token multiples) or the cache is
    # contiguous; pages of other sizes (each row finds its page; lane l looks up rows l and
    # l + 32 of the tile) at most 0.033 (0.0318 on sm_80 with nvcc 13.0, the sector map and the
    # slot-race __syncwarp; the issue asks 0.03; heads across warps' is under 0.03, below).
    (r"^nocap:.*tc_decode_kernel.*Li64E.*ELb1ELi2ELb1ELi4EEEv", r"sm_",
     dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048, loop_per_byte=0.03,
          need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128", "MOVM"], cp_async_only=True,
          loop_exact={"HMMA": 96, "LDSM": 64, "LDGSTS.128": 64})),
    (r"^nocap:.*tc_decode_kernel.*Li64E.*ELb0ELi2ELb1ELi4EEEv", r"sm_",
     dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048, loop_per_byte=0.033,
          need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128", "MOVM"], cp_async_only=True,
          loop_exact={"HMMA": 96, "LDSM": 64, "LDGSTS.128": 64})),
    (r"tc_decode_kernel.*Li64E.*ELi2ELb1ELi4EEEv", r"sm_", dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048,
                                                              need=["HMMA", "LDSM", "LDGSTS.128", "MOVM"],
                                                              cp_async_only=True)),
    (r"tc_decode_kernel.*ELi2ELb1ELi2EEEv", r"sm_", dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048,
                                                        need=["HMMA", "LDSM", "LDGSTS.128", "MOVM"],
                                                        cp_async_only=True)),
    (r"tc_decode_kernel", r"sm_", dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048,
                                       need=["HMMA", "LDSM", "LDGSTS.128"], cp_async_only=True)),
    # Heads across warps (tc_decode_hw_kernel, tc_decode_hw.cuh: one kv head per warp, every
    # tile; the swapped form's loop, the same per-64-token work): the census variants at most
    # 0.03 main-loop instructions per K/V byte in every instance, pages that do not hold whole
    # sub-tiles at D 64 included (0.0298 there with nvcc 13.0; the default's is 0.0318); no
    # stack or local memory in any instance, the shipped ones with the soft-cap branch too
    # (the per-warp output recomputes its indices after the loop instead of holding them).
    (r"^nocap:.*tc_decode_hw_kernel", r"sm_",
     dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048, loop_per_byte=0.03,
          need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128", "MOVM"], cp_async_only=True,
          loop_exact={"HMMA": 96, "LDSM": 64, "LDGSTS.128": 64})),
    (r"tc_decode_hw_kernel", r"sm_", dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048,
                                         need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128", "MOVM"],
                                         cp_async_only=True)),
    # The tensor-core decode's limiter probes (tc_decode_probe_kernel<kProbe>, issue 36; bf16 D
    # 128, the swapped 32-token form): load-only (1) keeps the 16-byte cp.async and drops the
    # tensor-core work; math-only (2) keeps the tensor-core loop without K/V loads (on sm_90
    # nvcc 13.0 puts its 8-byte frame's LDL/STL in the loop: a probe, named and bounded here);
    # the old plain lane map (3, shipped before the sector map) keeps an 8-byte frame outside
    # the loop (1 LDL, 1 STL, nvcc 13.0).
    (r"tc_decode_probe_kernelILi1E", r"sm_", dict(regs=128, stack=0, local=0, local_in_loop=0, smem=2048,
                                                 need=["LDGSTS.128"], cp_async_only=True)),
    (r"tc_decode_probe_kernelILi2E", r"sm_", dict(regs=128, stack=8, local=2, local_in_loop=2, smem=2048,
                                                 need=["HMMA", "LDSM.x4", "LDSM.x4.T", "MOVM"])),
    (r"tc_decode_probe_kernelILi3E", r"sm_", dict(regs=128, stack=8, local=2, local_in_loop=0, smem=2048,
                                                 need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128", "MOVM"],
                                                 cp_async_only=True)),
    # The tensor-core prefill (tc_prefill.cuh, issue 37): K/V through 16-byte cp.async only,
    # HMMA, LDSM.x4 and LDSM.x4.T present; <= 255 registers (2 CTAs per SM) and no local
    # memory at all. loop_exact: the main loop's tensor-core and shared-memory instructions
    # per 64-token KV tile and warp as designed (D 128: S 8 n-tiles x 8 k-steps = 64 HMMA,
    # P.V 16 n-tiles x 4 k-steps = 64, twice with the split P; LDSM.x4 32 for K, 32 for V;
    # D 64: half of S's and of the LDSM, the same P.V per n-tile; the copy, unrolled fully,
    # 2 LDGSTS.128 (K and V) per row a thread copies: 8 rows at D 128, 4 at D 64).
    # kMt 1 ("Li1EEEv"): 16 rows per warp. kMt 2 ("Li2EEEv", 32 rows per warp, D 128, paged:
    # kernels/tc_prefill_m2.cu and its census variants, ptxas -O1): each K/V fragment feeds
    # two m-tiles, so twice the HMMA per tile and warp, 32 + 32 LDSM.x4 for K and V plus 16
    # for Q (read from shared memory per k-step), the same copy; no stack either.
    # The steady state without maxima (kSteady: every instance but the 32-row ones with one
    # page entry per tile) has a rare path that computes S again: the whole loop holds S's
    # HMMA and LDSM (K, and Q at 32 rows) twice, a tile runs them once (census_interior).
    (r"tc_prefill_kernel.*Li128E.*Lb1ELb1ELi2EEEv", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=2048,
                                                        need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128"],
                                                        cp_async_only=True,
                                                        loop_exact={"HMMA": 384, "LDSM": 80, "LDGSTS.128": 16})),
    (r"tc_prefill_kernel.*Li128E.*Lb1ELb0ELi2EEEv", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=2048,
                                                        need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128"],
                                                        cp_async_only=True,
                                                        loop_exact={"HMMA": 256, "LDSM": 80, "LDGSTS.128": 16})),
    (r"tc_prefill_kernel.*Li128E.*Lb0ELb1ELi2EEEv", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=2048,
                                                        need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128"],
                                                        cp_async_only=True,
                                                        loop_exact={"HMMA": 512, "LDSM": 128, "LDGSTS.128": 16})),
    (r"tc_prefill_kernel.*Li128E.*Lb0ELb0ELi2EEEv", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=2048,
                                                        need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128"],
                                                        cp_async_only=True,
                                                        loop_exact={"HMMA": 384, "LDSM": 128, "LDGSTS.128": 16})),
    (r"^nocap:.*tc_prefill_kernel.*Li2EEEv", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=2048,
                                                         need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128"],
                                                         cp_async_only=True)),
    (r"tc_prefill_kernel.*Li128E.*Lb1ELi1EEEv", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=2048,
                                                        need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128"],
                                                        cp_async_only=True,
                                                        loop_exact={"HMMA": 256, "LDSM": 96, "LDGSTS.128": 16})),
    (r"tc_prefill_kernel.*Li128E.*Lb0ELi1EEEv", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=2048,
                                                        need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128"],
                                                        cp_async_only=True,
                                                        loop_exact={"HMMA": 192, "LDSM": 96, "LDGSTS.128": 16})),
    (r"tc_prefill_kernel.*Li64E.*Lb1ELi1EEEv", r"sm_", dict(regs=255, stack=0, local=0, local_in_loop=0, smem=2048,
                                                       need=["HMMA", "LDSM.x4", "LDSM.x4.T", "LDGSTS.128"],
                                                       cp_async_only=True,
                                                       loop_exact={"HMMA": 128, "LDSM": 48, "LDGSTS.128": 8})),
    # The tensor-core probe of tests/gpu: every wrapper compiles to its instruction.
    (r"tc_probe_kernel", r"sm_", dict(regs=255, stack=0, local=0, smem=1536,
                                      need=["HMMA.BF16", "HMMA.F16", "LDSM.x1", "LDSM.x2", "LDSM.x4", "LDSM.x1.T",
                                            "LDSM.x2.T", "LDSM.x4.T", "LDGSTS.128", "DEPBAR"])),
    # The sm_90a probe of kernels/hopper.cuh (tests/kernels/static/hopper_probe.cu): wgmma,
    # the TMA tile load and the mbarrier compile to theirs.
    (r"hopper_probe_kernel", r"sm_90a", dict(regs=128, stack=0, local=0, smem=8192,
                                             need=["HGMMA", "UTMALDG", "SYNCS", "WARPGROUP"])),
    # The sm_90a prefill scaffold (kernels/hopper_prefill.cuh, built for sm_90a alone into
    # kvmm_cuda): warpgroup MMA, 5-D TMA loads, mbarriers, register reallocation
    # (USETMAXREG: the producer's dec, the consumers' inc), no local memory. At most 168
    # registers at launch (384 threads: a producer and two consumer warpgroups fill the
    # register file); after setmaxnreg the producer runs on 24 and each consumer on 240
    # (ptxas allocates those regions up to their setmaxnreg counts). The main loop (a
    # consumer's, per 64-token tile) holds 8 wgmma m64n64k16 for S_i (8 k-steps) and 16
    # for P V_{i-1} (4 k-steps x 2 dim halves x P's two parts, A from registers, V
    # MN-major); its one inner loop is the full barrier's try_wait spin, one trip when the
    # stage has landed.
    # Its round_p_once instance (kSplitP = false): 8 n64 wgmma for S, 8 for P V.
    # ex2_before_pv_wait: the tile's exponentials are issued before the wait for P V_{i-1}
    # (FA3's intra-warpgroup overlap; hp_softmax runs them inside each arm of its mask
    # branch, since ptxas hoists the wait to the top of the block after it).
    (r"hopper_prefill_kernel.*Lb0E", r"sm_90a", dict(regs=168, stack=0, local=0, local_in_loop=0, smem=2048,
                                                     need=["HGMMA", "UTMALDG", "SYNCS", "WARPGROUP", "USETMAXREG"],
                                                     inner_trips=[1], loop_exact={"HGMMA": 16},
                                                     ex2_before_pv_wait=True)),
    (r"hopper_prefill_kernel", r"sm_90a", dict(regs=168, stack=0, local=0, local_in_loop=0, smem=2048,
                                               need=["HGMMA", "UTMALDG", "SYNCS", "WARPGROUP", "USETMAXREG"],
                                               inner_trips=[1], loop_exact={"HGMMA": 24}, ex2_before_pv_wait=True)),
]

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def tool(venv, name):
    """cuobjdump/nvdisasm from the venv of scripts/kernel_tools.sh, else from PATH."""
    for d in glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "cu*", "bin")):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name), d
    p = shutil.which(name)
    if p:
        return p, os.path.dirname(p)
    sys.exit(f"census: {name} not found in {venv} nor on PATH: run scripts/kernel_tools.sh")


def classes(op, operands):
    """The census classes of one instruction."""
    out = []
    fam = op.split(".")[0]
    if fam in ("LDG", "STG", "LDS", "STS", "LDGSTS", "LDL", "STL"):
        width = 128 if ".128" in op else 64 if ".64" in op else 32
        if any(t in op for t in (".U8", ".S8", ".U16", ".S16")):
            width = 16
        out += [fam, f"{fam}.{width}"]
    elif fam == "HMMA":
        out += ["HMMA", "HMMA.BF16" if ".BF16" in op else "HMMA.F16"]
    elif fam == "LDSM":
        n = 4 if op.endswith(".4") else 2 if op.endswith(".2") else 1
        out += ["LDSM", f"LDSM.x{n}" + (".T" if ".MT88" in op else "")]
    elif fam == "MUFU":
        out += ["MUFU"] + (["MUFU.EX2"] if ".EX2" in op else [])
    elif fam == "WARPGROUP":
        # wgmma.wait_group 0: every wgmma group of the warpgroup retired
        out += ["WARPGROUP"] + (["WGMMA.WAIT0"] if op == "WARPGROUP.DEPBAR.LE" and re.search(r"gsb0,\s*0x0$",
                                                                                          operands.strip()) else [])
    else:
        out.append(fam)
    return out


def parse(path, cuobjdump, env):
    """{(arch, kernel): {'res': {...}, 'all': Counter, 'loop': Counter}}; path may end in
    @MANGLED_NAME to read that kernel only (an executable that links kvmm_cuda again)."""
    path, _, fun = path.partition("@")
    sel = ["-fun", fun] if fun else []
    res = subprocess.run([cuobjdump, "-res-usage", *sel, path], capture_output=True, text=True, env=env,
                         check=True).stdout
    sass = subprocess.run([cuobjdump, "-sass", *sel, path], capture_output=True, text=True, env=env, check=True).stdout
    return parse_text(res, sass)


def parse_text(res_txt, sass):
    """The census of cuobjdump's -res-usage and -sass listings."""
    res = {}
    arch = None
    fn = None
    for line in res_txt.splitlines():
        m = re.search(r"arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
        m = re.search(r"Function (\S+):", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and fn:
            res[(arch, fn)] = dict(zip(("regs", "stack", "smem", "local_bytes"), map(int, m.groups())))
            fn = None
    kernels = {}
    arch, fn, instrs = None, None, []

    def flush():
        if fn is None:
            return
        allc, loopc = Counter(), Counter()
        span = (0, -1)
        # Code after the last unconditional EXIT is out of line (divergence fallbacks of
        # warp votes, called routines): its branches back into the body are no loop.
        end = max((a for a, op, rest, pred in instrs if op == "EXIT" and not pred), default=1 << 62)
        for addr, op, rest, _ in instrs:
            if op.split(".")[0] == "BRA" and addr < end:
                m = re.search(r"0x([0-9a-f]+)", rest)
                if m and int(m.group(1), 16) < addr and addr - int(m.group(1), 16) > span[1] - span[0]:
                    span = (int(m.group(1), 16), addr)
        # Inner loops: backward branches inside the main loop other than its own. Their
        # bodies run once per trip, but a listing shows them once: the census multiplies
        # them only by trip counts declared in LIMITS (scale_inner), and --check fails on
        # an inner loop without one.
        inner = []
        for addr, op, rest, _ in instrs:
            m = re.search(r"0x([0-9a-f]+)", rest) if op.split(".")[0] == "BRA" else None
            if m and (int(m.group(1), 16), addr) != span and span[0] <= int(m.group(1), 16) < addr <= span[1]:
                inner.append((int(m.group(1), 16), addr))
        body = []
        for addr, op, rest, _ in instrs:
            cl = classes(op, rest)
            allc.update(cl)
            allc["instrs"] += 1
            if span[0] <= addr <= span[1]:
                loopc.update(cl)
                loopc["instrs"] += 1
                body.append((addr, cl))
        kernels[(arch, fn)] = dict(res=res.get((arch, fn), {}), all=allc, loop=loopc, inner=inner, body=body)

    for line in sass.splitlines():
        m = re.search(r"arch = (sm_\w+)|code for (sm_\w+)", line)
        if m:
            flush()
            fn, instrs = None, []
            arch = m.group(1) or m.group(2)
            continue
        m = re.search(r"Function : (\S+)", line)
        if m:
            flush()
            fn, instrs = m.group(1), []
            continue
        m = INSTR.search(line)
        if m and fn:
            instrs.append((int(m.group(1), 16), m.group(3), m.group(4), m.group(2)))
    flush()
    return kernels


def short(fn):
    """A readable kernel name from the mangled one."""
    m = re.search(r"attention_kernelINS1_(\d+)(\w+?)ELi(\d+)ELi(\d+)ENS1_\d+(\w+?)EEEv", fn)
    if m:
        return f"attention<{m.group(2)},D{m.group(3)},G{m.group(4)},{m.group(5)}>"
    m = re.search(r"tc_decode_kernelINS1_(\d+)(\w+?)ELi(\d+)ENS1_\d+(\w+?)ELb([01])E(?:Li(\d+)E)?(?:Lb([01])E)?(?:Li(\d+)E)?EEv", fn)
    if m:  # kTileInPage: one page entry per 16-token tile ("tile") or per row ("row"); ring stages if
        # not 2; ",swap": swapped operands (kSwap: S^T = K Q^T, groups of at most 8); ",T32",
        # ",T64": 32- and 64-token warp tiles (kSub 2, 4)
        stages = f",S{m.group(6)}" if m.group(6) and m.group(6) != "2" else ""
        swap = ",swap" if m.group(7) == "1" else ""
        sub = f",T{16 * int(m.group(8))}" if m.group(8) and m.group(8) != "1" else ""
        return (f"tc_decode<{m.group(2)},D{m.group(3)},{m.group(4)},{'tile' if m.group(5) == '1' else 'row'}"
                f"{stages}{swap}{sub}>")
    m = re.search(r"tc_decode_hw_kernelINS1_(\d+)(\w+?)ELi(\d+)ENS1_\d+(\w+?)ELb([01])EEEv", fn)
    if m:  # heads across warps: the swapped form at 2 stages, 32-token tiles at D 128, 64 at D 64
        return (f"tc_decode_hw<{m.group(2)},D{m.group(3)},{m.group(4)},{'tile' if m.group(5) == '1' else 'row'},"
                f"T{32 if m.group(3) == '128' else 64}>")
    m = re.search(r"tc_prefill_kernelINS1_(\d+)(\w+?)ELi(\d+)ENS1_\d+(\w+?)ELb([01])ELb([01])ELi(\d+)EEEv", fn)
    if m:  # kTileInPage ("tile": one page entry per 64-token tile, "row"), kSplitP ("splitP" or "P"), kMt (M2: 32 rows per warp)
        return (f"tc_prefill<{m.group(2)},D{m.group(3)},{m.group(4)},{'tile' if m.group(5) == '1' else 'row'},"
                f"{'splitP' if m.group(6) == '1' else 'P'}{',M' + m.group(7) if m.group(7) != '1' else ''}>")
    m = re.search(r"hopper_prefill_kernelINS1_\d+(\w+?)ELb([01])E", fn)
    if m:  # kSplitP ("splitP" or "P")
        return f"hopper_prefill<{m.group(1)},{'splitP' if m.group(2) == '1' else 'P'}>"
    m = re.search(r"(merge_kernel|write_kv_kernel|copy_pages_kernel|tc_probe_kernel|hopper_probe_kernel|hopper_prefill_kernel)\w*?(BFloat|Half)?", fn)
    return (m.group(1) + (f"<{m.group(2)}>" if m.group(2) else "")) if m else fn[:60]


def limits_of(arch, fn, limits=None):
    """The LIMITS row of one kernel build (the first that matches), or None."""
    rows = [lim for rx, ax, lim in (LIMITS if limits is None else limits) if re.search(rx, fn) and re.search(ax, arch)]
    return rows[0] if rows else None


def scale_inner(kernels, limits=None):
    """Multiplies the main-loop counts of inner loops by the trip counts their LIMITS row
    declares (inner_trips: one per inner loop, in address order; an instruction in nested
    inner loops is multiplied by each). Returns the errors: an inner loop without a declared
    trip count (its body would be counted once per outer iteration, not once per trip), or
    a declaration that no longer matches the listing."""
    errors = []
    for (arch, fn), k in sorted(kernels.items()):
        lim = limits_of(arch, fn, limits)
        declared = (lim or {}).get("inner_trips", [])
        inner = k.get("inner", [])
        name = f"{arch} {short(fn[6:]) if fn[:6] in ('nocap:', 'inner:') else short(fn)}"
        if len(declared) != len(inner):
            where = ", ".join(f"0x{t:x}-0x{a:x} ({sum(1 for x, _ in k['body'] if t <= x <= a)} instructions)"
                              for t, a in inner)
            errors.append(f"{name}: main loop holds {len(inner)} inner loop(s) [{where}] but its census row declares "
                          f"{len(declared)} trip count(s) (inner_trips): "
                          + ("unroll the inner loop or declare its trips" if len(inner) > len(declared)
                             else "the declaration is stale"))
            continue
        if not inner or k.get("inner_scaled"):
            continue
        loopc = Counter()
        for addr, cl in k["body"]:
            mult = 1
            for (t, a), trips in zip(inner, declared):
                mult *= trips if t <= addr <= a else 1
            for c in cl + ["instrs"]:
                loopc[c] += mult
        k["loop"], k["inner_scaled"] = loopc, True
    return errors


def check(kernels, require_probes=False, limits=None):
    """Errors of `kernels` against `limits` (default LIMITS). Rows whose regex starts with
    ^nocap: apply to the census variants only (their names carry that prefix)."""
    limits = LIMITS if limits is None else limits
    errors = scale_inner(kernels, limits)  # first: the loop limits below see the multiplied counts
    for (arch, fn), k in sorted(kernels.items()):
        lim = limits_of(arch, fn, limits)
        if lim is None:
            # A kernel some row names, built for an architecture none of its rows allows (an
            # sm_90a-only kernel compiled for sm_80/sm_90 would be dispatched where it must not).
            if any(re.search(rx, fn) for rx, _, _ in limits):
                errors.append(f"{arch} {short(fn)}: built for {arch}, which no census row of this kernel allows")
            continue  # kernels kvmm does not own (none today) are listed, not checked
        r, a, lp = k["res"], k["all"], k["loop"]
        name = f"{arch} {short(fn)}"
        local_all = a["LDL"] + a["STL"]
        if r.get("regs", 0) > lim["regs"]:
            errors.append(f"{name}: {r['regs']} registers > {lim['regs']}")
        if r.get("stack", 0) > lim["stack"]:
            errors.append(f"{name}: stack frame {r['stack']} B > {lim['stack']}")
        if local_all > lim["local"]:
            errors.append(f"{name}: {local_all} local-memory instructions (spills) > {lim['local']}")
        if lp["LDL"] + lp["STL"] > lim.get("local_in_loop", 0):
            errors.append(f"{name}: local memory in the main loop")
        if r.get("smem", 0) > lim["smem"]:
            errors.append(f"{name}: {r['smem']} B shared > {lim['smem']}")
        for need in lim.get("need", []):
            if a[need] == 0:
                errors.append(f"{name}: no {need}")
        if lim.get("cp_async_only") and (lp["LDG.128"] > 0 or a["LDGSTS"] != a["LDGSTS.128"]):
            errors.append(f"{name}: K/V not only by 16-byte cp.async ({lp['LDG.128']} LDG.128 in the loop, "
                          f"{a['LDGSTS'] - a['LDGSTS.128']} narrower LDGSTS)")
        if "loop_per_byte" in lim:  # static main-loop instructions per K/V byte (16-byte cp.async)
            kv_bytes = lp["LDGSTS.128"] * 16 * 32
            if kv_bytes == 0 or lp["instrs"] / kv_bytes > lim["loop_per_byte"]:
                errors.append(f"{name}: main loop {lp['instrs']} instructions per {kv_bytes} B of K/V "
                              f"> {lim['loop_per_byte']} per byte")
        if lim.get("ex2_before_pv_wait"):
            # FA3's intra-warpgroup overlap: the main loop's exponentials (the softmax of S_i)
            # all come before its first wgmma.wait_group 0 (the wait for P V_{i-1}), so they
            # run under this consumer's own P V, not after it.
            body = sorted(k["body"])
            wait = next((addr for addr, cl in body if "WGMMA.WAIT0" in cl), None)
            before = sum(1 for addr, cl in body if "MUFU.EX2" in cl and (wait is None or addr < wait))
            after = sum(1 for addr, cl in body if "MUFU.EX2" in cl and wait is not None and addr > wait)
            if wait is None or after > 0 or before < 32:
                errors.append(f"{name}: {after} MUFU.EX2 after the main loop's wgmma.wait_group 0 "
                              f"({before} before it; designed: the tile's exponentials, >= 32, all before)")
        for cls, n in lim.get("loop_exact", {}).items():
            if lp[cls] != n:
                errors.append(f"{name}: {lp[cls]} {cls} in the main loop, designed {n}")
        if lim.get("kv_loads_128"):
            if lp["LDG.128"] < 8 or lp["LDG.32"] + lp["LDG.64"] + lp["LDG.16"] > 4:
                errors.append(f"{name}: main loop loads {lp['LDG.128']} x 16 B, "
                              f"{lp['LDG.32'] + lp['LDG.64'] + lp['LDG.16']} narrower")
    for rx, ax, lim in limits:  # a probe that is missing altogether proves nothing
        if require_probes and lim.get("need") and not any(re.search(rx, fn) and re.search(ax, a) for a, fn in kernels):
            errors.append(f"no kernel matches {rx} on {ax}: its probe was not given")
    return errors


COLS = ["instrs", "LDG.128", "LDG.32", "SHFL", "MUFU", "FFMA", "HMMA", "LDSM", "LDGSTS", "LDL", "STL"]


def table(kernels, only=None):
    lines = ["| arch | kernel | regs | stack B | smem B | " + " | ".join(c + " all/loop" for c in COLS) + " |",
             "|---" * (5 + len(COLS)) + "|"]
    for (arch, fn), k in sorted(kernels.items(), key=lambda x: (x[0][0], short(x[0][1]))):
        if only and not re.search(only, fn):
            continue
        r = k["res"]
        tag = {"nocap:": " nocap", "inner:": " interior"}.get(fn[:6], "")
        lines.append(f"| {arch} | {short(fn)}{tag} | {r.get('regs', '')} | {r.get('stack', '')} | {r.get('smem', '')} | "
                     + " | ".join(f"{k['all'][c]}/{k['loop'][c]}" for c in COLS) + " |")
    return "\n".join(lines)


def self_test():
    """The checks fire: synthetic listings with a spill in the loop, 8-byte K/V loads, a
    probe without HMMA, too many registers; a clean kernel passes."""
    def listing(name, body, arch="sm_90"):
        lines = [f"arch = {arch}", f"Function : {name}"]
        for i, ins in enumerate(body):
            lines.append(f"        /*{i * 16:04x}*/                   {ins} ;")
        return "\n".join(lines)

    def loop(ops):  # a loop whose backward branch spans every op
        return ops + [f"BRA 0x0000"]

    kv = ["LDG.E.128.CONSTANT R4, [R2.64]"] * 8 + ["LDG.E.CONSTANT R9, [R2.64]"] * 4
    g4 = "_ZN4kvmm7kernels6device16attention_kernelINS1_6BFloatELi128ELi4ENS1_9PagedAddrEEEvNS1_8AttnArgsET2_"
    probe = "_ZN4kvmm4test15tc_probe_kernelEPKNS0_9TcProbeInEPNS0_10TcProbeOutE"
    hp = "_ZN4kvmm7kernels6device21hopper_prefill_kernelINS1_6BFloatELb1EEEvNS1_9TensorMapENS1_8AttnArgsENS1_4HpKVE"
    cases = {
        "clean": (listing(g4, loop(kv + ["FFMA R1, R2, R3, R4"])), 128, 0),
        "spill in loop": (listing(g4, loop(kv + ["STL [R1], R2", "LDL R2, [R1]"])), 128, 0),
        "narrow K/V": (listing(g4, loop(["LDG.E.64.CONSTANT R4, [R2.64]"] * 16)), 128, 0),
        "registers": (listing(g4, loop(kv)), 168, 0),
        "probe without HMMA": (listing(probe, ["LDSM.16.M88 R1, [R2]", "LDGSTS.E.BYPASS.128 [R1], [R2.64]"]), 32, 0),
        "sm_90a kernel built for sm_90": (listing(hp, loop(["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24"])), 168, 0),
    }
    bad = 0
    for name, (sass, regs, stack) in cases.items():
        fn = re.search(r"Function : (\S+)", sass).group(1)
        res = f"arch = sm_90\n Function {fn}:\n  REG:{regs} STACK:{stack} SHARED:0 LOCAL:0"
        errors = check(parse_text(res, sass))
        fired = bool(errors)
        print(f"self-test {name}: {'flagged' if fired else 'passed'} {errors[:1]}")
        bad += fired != (name != "clean")
    missing = check(parse_text(f"arch = sm_90\n Function {g4}:\n  REG:128 STACK:0 SHARED:0 LOCAL:0",
                               listing(g4, loop(kv))), require_probes=True)
    print(f"self-test probes missing: {'flagged' if missing else 'passed'} {missing[:1]}")
    bad += not missing
    # An out-of-line block after EXIT (a vote's divergence fallback) branching back to the
    # kernel's start is no loop: the main loop stays the 13-instruction one.
    body = loop(kv) + ["EXIT", "VOTE.ANY R1, PT, P0", "BRA 0x0000"]
    k = parse_text(f"arch = sm_90\n Function {g4}:\n  REG:128 STACK:0 SHARED:0 LOCAL:0", listing(g4, body))
    n_loop = next(iter(k.values()))["loop"]["instrs"]
    print(f"self-test out-of-line branch: main loop {n_loop} instructions (13 expected)")
    bad += n_loop != 13
    # An inner loop in the main loop (a copy loop unrolled by 2, 4 trips) is counted once per
    # trip only where the kernel's row declares its trips: undeclared it fails the check;
    # declared, its 3 instructions count 4 times (12 + 3 x 4 + the latch = 25); a declaration
    # with no inner loop left in the listing fails too.
    res = f"arch = sm_90\n Function {g4}:\n  REG:128 STACK:0 SHARED:0 LOCAL:0"
    nested = listing(g4, kv + ["FFMA R1, R2, R3, R4", "FFMA R5, R2, R3, R4", "BRA 0x00c0", "BRA 0x0000"])
    row = next(lim for rx, ax, lim in LIMITS if re.search(rx, g4) and re.search(ax, "sm_90"))
    declared = [(r"attention_kernel.*Li4E", r"sm_9", dict(row, inner_trips=[4]))] + LIMITS
    undeclared = check(parse_text(res, nested))
    print(f"self-test inner loop undeclared: {'flagged' if undeclared else 'passed'} {undeclared[:1]}")
    k = parse_text(res, nested)
    ok = check(k, limits=declared)
    n_loop, n_ffma = next(iter(k.values()))["loop"]["instrs"], next(iter(k.values()))["loop"]["FFMA"]
    print(f"self-test inner loop declared (4 trips): {'flagged' if ok else 'passed'} {ok[:1]}, main loop {n_loop} "
          f"instructions (25 expected), {n_ffma} FFMA (8 expected)")
    stale = check(parse_text(res, listing(g4, loop(kv))), limits=declared)
    print(f"self-test inner loop declared but absent: {'flagged' if stale else 'passed'} {stale[:1]}")
    bad += (not undeclared) + bool(ok) + (n_loop != 25) + (n_ffma != 8) + (not stale)
    # The exponentials against the wait for P V: before it passes, after it fails.
    hp_row = [(r"hopper_prefill_kernel", r"sm_90a", dict(regs=168, stack=0, local=0, smem=2048, ex2_before_pv_wait=True))]
    hp_res = f"arch = sm_90a\n Function {hp}:\n  REG:168 STACK:0 SHARED:0 LOCAL:0"
    ex2 = ["MUFU.EX2 R88, R88"] * 32
    w1, w0 = "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0"
    early = check(parse_text(hp_res, listing(hp, loop([w1] + ex2 + [w0, "FMUL R24, R24, R17"]), "sm_90a")), limits=hp_row)
    late = check(parse_text(hp_res, listing(hp, loop([w1, w0] + ex2 + ["FMUL R24, R24, R17"]), "sm_90a")), limits=hp_row)
    print(f"self-test exponentials before the P V wait: {'flagged' if early else 'passed'} {early[:1]}; "
          f"after it: {'flagged' if late else 'passed'} {late[:1]}")
    bad += bool(early) + (not late)
    print(f"census self-test: {len(cases) + 7 - bad} of {len(cases) + 7} as expected")
    return bad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--self-test", action="store_true", help="check the checks on synthetic listings")
    ap.add_argument("--venv", default="/opt/kvmm-venvs/cuobjdump")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--require-probes", action="store_true", help="--check: every probe row of LIMITS must match a kernel")
    ap.add_argument("--only", help="regex: table rows to print")
    args = ap.parse_args()
    if args.self_test:
        sys.exit(0 if self_test() else 1)
    if not args.files:
        ap.error("no files")
    cuobjdump, bindir = tool(args.venv, "cuobjdump")
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    kernels = {}
    variants = set()
    for f in args.files:
        found = parse(f, cuobjdump, env)
        if "census_variants" in f.partition("@")[0]:  # the no-soft-cap instantiations: keyed apart
            found = {(a, "nocap:" + fn): k for (a, fn), k in found.items()}
            variants.update(found)
        elif "census_interior" in f.partition("@")[0]:  # the prefill's interior-tile path: keyed apart
            found = {(a, "inner:" + fn): k for (a, fn), k in found.items()}
            variants.update(found)
        kernels.update(found)
    # Before the table and the JSON: the model reads the variants' loop counts too.
    inner_errors = scale_inner({key: k for key, k in kernels.items() if key in variants})
    scale_inner(kernels)
    print(table(kernels, args.only))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({f"{a} {short(fn[6:]) + (' nocap' if fn.startswith('nocap:') else ' interior') if fn[:6] in ('nocap:', 'inner:') else short(fn)}":
                       dict(res=k["res"], all=dict(k["all"]), loop=dict(k["loop"]))
                       for (a, fn), k in kernels.items()}, out, indent=1, sort_keys=True)
    if args.check:
        real = {key: k for key, k in kernels.items() if key not in variants}
        errors = check(real, args.require_probes, [row for row in LIMITS if not row[0].startswith("^nocap:")])
        # The census variants (no soft cap: the benchmarks' path) against their own rows.
        errors += check({key: kernels[key] for key in variants}, args.require_probes,
                        [row for row in LIMITS if row[0].startswith("^nocap:")])
        errors = list(dict.fromkeys(errors + inner_errors))  # the variants' inner loops, once
        owned = sum(1 for (a, fn) in real if any(re.search(rx, fn) for rx, _, _ in LIMITS))
        for e in errors:
            print("FAIL", e)
        print(f"census: {owned} kernel builds checked, {len(errors)} failed")
        if owned == 0:
            errors.append("no kernel found")
        sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
