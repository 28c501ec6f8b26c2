#!/usr/bin/env bash
# One prepared GPU check of kvmm's attention kernels (H100/H200), in two calls of at most
# 6 minutes each on the same machine, with the Debian kit of ../shared/tools/device-kit.sh
# (.device-kit/) carried beside the checkout. kvmm needs libsodium, which the kit's default
# list lacks: prepare it with `../shared/tools/device-kit.sh libsodium-dev libsodium23`.
# One call of `all` (KVMM_GPU_BUDGET=560, timeout 590 s) took 185 s on an H200 (2026-11-28).
# The two calls:
#   call 1 (timeout 360 s): source .device-kit/setup.sh && bash scripts/gpu_kernels.sh core
#       build (sm_90), SASS census against the CPU-side one, GPU tests, benchmarks in decimal
#       units beside the copy rate of the same run, predicted-vs-measured table
#   call 2 (timeout 330 s): source .device-kit/setup.sh && bash scripts/gpu_kernels.sh profile
#       torch SDPA on the same shapes, ncu on three kernels, compute-sanitizer racecheck and
#       synccheck on the [sanitize] tests; reuses build-gpu/ (ignored; rebuilt if gone)
# One call of `limiter` (issue 36: what holds the tensor-core decode at 0.64 of copy; builds
# bench_kernels only, budget KVMM_GPU_BUDGET or 300 s, about 90 s of it the build):
#   source .device-kit/setup.sh && KVMM_GPU_BUDGET=280 bash scripts/gpu_kernels.sh limiter
#       the decode rows with the probes of TcDecodeShape::probe (load-only, math-only, the
#       old plain lane map) and the read-pattern rows (head-major pages and slots, _hnd; one kv
#       head at 8x the batch, _kv1; heads across warps, _hw) beside the default and contiguous
#       tc rows, then ncu (stall reasons, scheduler, memory tables, occupancy) on the default tc
#       kernel, heads across warps, the head-major tc kernel, the load-only and plain-map
#       probes, the contiguous one and the old kernel, one launch each (in that order: what the
#       budget cuts is the last)
# The census needs cuobjdump + nvdisasm: the GPU machine's toolkit on PATH, or the pinned
# PyPI ones prepared here and carried in the kit:
#   KVMM_CUDA_TOOLS_VENV=$PWD/.device-kit/cuobjdump scripts/kernel_tools.sh
# then prefix the calls with KVMM_CUDA_TOOLS_VENV=.device-kit/cuobjdump.
# cuDNN's paged SDPA (issue 37 item 3), one call (timeout 300 s; ~90 s build, then < 200 s):
#   scripts/cudnn_frontend.sh --kit .device-kit/cudnn-frontend     # here, before the call
#   source .device-kit/setup.sh && bash scripts/gpu_kernels.sh cudnn
#       builds kvmm_test_gpu_cudnn + bench_kernels against the frontend headers of the kit
#       (KVMM_CUDNN_FRONTEND_INCLUDE) and the cuDNN of python3's nvidia-cudnn pip package
#       (or KVMM_CUDNN_ROOT), runs the cuDNN GPU test, then the cuDNN and tensor-core prefill rows.
# Without a GPU: `bash scripts/gpu_kernels.sh --dry-run` (CI) checks the script's syntax,
# runs its parsers on the committed H100 output (docs/results/kernels-h100.md) and the
# model on the census of this build (KVMM_CENSUS_JSON), and prints the plan; it measures
# nothing and claims nothing. At most 8 files are written under $OUT; summary.md last.
set -uo pipefail
cd "${KVMM_ROOT:-$(git rev-parse --show-toplevel 2>/dev/null || echo "$(dirname "$0")/..")}"
mode=${1:-core}

if [[ $mode == --dry-run ]]; then
  set -e
  bash -n "$0"
  echo "gpu_kernels --dry-run: no GPU used, nothing measured"
  table=$(python3 bench/kernels/bench_table.py docs/results/kernels-h100.md)
  echo "$table" | sed -n '1,6p'
  echo "($(echo "$table" | grep -c '^| decode\|^| prefill') rows parsed from docs/results/kernels-h100.md)"
  census=${KVMM_CENSUS_JSON:-build/release/kernels_census.json}
  if [[ -f $census ]]; then
    python3 bench/kernels/model.py --check --census "$census" --measured docs/results/kernels-h100.md
  else
    echo "gpu_kernels --dry-run: no census at $census (ctest kernels_static writes it): model step not exercised"
    [[ -n ${KVMM_CENSUS_JSON:-} ]] && exit 1
  fi
  echo "plan: core (budget 330 s): configure+build sm_90 | census | kvmm_test_gpu | bench_kernels (filtered) | model"
  echo "plan: profile (budget 300 s): sdpa_bench.py | ncu x3 | compute-sanitizer racecheck, synccheck [sanitize]"
  echo "plan: cudnn (budget 280 s): configure+build kvmm_test_gpu_cudnn bench_kernels | kvmm_test_gpu_cudnn | prefill cudnn + tc rows"
  echo "plan: limiter (budget KVMM_GPU_BUDGET or 300 s): configure+build bench_kernels | decode probe + hnd/kv1/hw rows | ncu x7 (sections) + stall metrics x2"
  echo "limiter filter: $(sed -n 's/^ *local filter=.\(copy_d2d|decode_paged_tc_(loadonly.*\).$/\1/p' "$0")"
  exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_kernels: no GPU here, nothing measured (mode $mode)"
  exit 0
fi

out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
sum=$out/summary.md
: >"$sum"
B=$PWD/build-gpu
start=$SECONDS
case $mode in
  core) budget=330 ;; profile) budget=300 ;; cudnn) budget=${KVMM_GPU_BUDGET:-280} ;; limiter) budget=${KVMM_GPU_BUDGET:-300} ;;
  *) budget=${KVMM_GPU_BUDGET:-540} ;;
esac
say() { printf '%s\n' "$*" | tee -a "$sum"; }
step() { # step NAME SECONDS LOGFILE CMD...: the timeout is capped by what is left of the budget
  local name=$1 lim=$2 log=$3
  shift 3
  local left=$((budget - (SECONDS - start)))
  if ((left < 15)); then
    say "- $name: skipped, budget spent"
    return 99
  fi
  ((lim > left)) && lim=$left
  local t=$SECONDS
  echo "### $name: $*" >>"$log"
  timeout -k 5 "$lim" "$@" >>"$log" 2>&1
  local rc=$?
  say "- $name: rc $rc, $((SECONDS - t)) s$([[ $rc == 124 ]] && echo ' (timed out)')"
  return $rc
}
say "# kvmm GPU check ($mode), $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null)"
say "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv,noheader)"

build() {
  if [[ -x $B/tests/kvmm_test_gpu && -x $B/bench/kernels/bench_kernels ]]; then
    say "- build: reused"
    return 0
  fi
  step configure 90 "$out/build.log" cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DKVMM_CUDA=ON \
    -DKVMM_CUDA_ARCHITECTURES="${KVMM_GPU_ARCHS:-90}" -DKVMM_BUILD_TESTS=ON -DKVMM_BUILD_BENCH=ON \
    -DKVMM_BUILD_EXAMPLES=OFF -DKVMM_PYTHON=OFF || return 1
  step build 200 "$out/build.log" cmake --build "$B" -j"$(nproc)" --target kvmm_test_gpu bench_kernels \
    kvmm_census_variants
}

census() { # the real disassembly of this machine's build, against the limits; JSON for the model
  step census 60 "$out/sass.txt" python3 bench/kernels/census.py --check --venv "${KVMM_CUDA_TOOLS_VENV:-/opt/kvmm-venvs/cuobjdump}" \
    --json "$B/kernels_census.json" "$B/libkvmm_cuda.a" "$B/tests/libkvmm_census_variants.a"
  grep -E "census:|FAIL|G4,PagedAddr|G4,ContiguousAddr" "$out/sass.txt" | grep -E "census:|FAIL|D128" >>"$sum"
}

bench() {
  local filter='copy_d2d|decode_paged/batch:(1|16|64|256)/ctx:(1024|4096|32768)/tpp:16/|decode_paged/batch:64/ctx:4096/tpp:(1|256)/|decode_contiguous/batch:(1|16|64|256)/ctx:(1024|4096|32768)/|decode_paged_tc/batch:(1|16|64|256)/ctx:(1024|4096|32768)/tpp:16/|decode_paged_tc/batch:64/ctx:4096/tpp:1/|decode_contiguous_tc/batch:(1|16|64|256)/ctx:(1024|4096|32768)/|decode_paged_tc(3|4)/batch:(16|64)/ctx:(4096|32768)/tpp:16/|decode_paged_tcm/batch:(1|16|64)/ctx:(4096|32768)/tpp:16/|decode_paged_tc_(t16|hf|t16hf)/batch:(16|64|256)/ctx:(4096|32768)/tpp:16/|decode_paged_tc_t16/batch:(1|64|256)/ctx:(1024|32768)/tpp:16/|decode_paged_(tc_hnd|hnd|tc_kv1)/batch:(16|64|256)/ctx:(1024|4096|32768)/tpp:16/|decode_contiguous_tc_hnd/batch:(16|64|256)/ctx:(1024|4096|32768)/|decode_paged_tc_hw/batch:(1|16|64|256)/ctx:(4096|32768)/tpp:16/|decode_contiguous_tc_hw/batch:(16|64|256)/ctx:(4096|32768)/|prefill_paged(_tc|_tc1|_tc32|_tc32_1|_h90|_h90_1)?/chunk:(512|2048)/ctx:(2048|8192)/'
  step bench 150 "$out/bench.txt" "$B/bench/kernels/bench_kernels" --benchmark_filter="$filter" --benchmark_min_time=0.2
  python3 bench/kernels/bench_table.py "$out/bench.txt" | tee -a "$sum"
}

build_bench() { # limiter: bench_kernels alone (an existing build-gpu/ is brought up to date, not trusted)
  [[ -f $B/CMakeCache.txt ]] || step configure 90 "$out/build.log" cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DKVMM_CUDA=ON \
    -DKVMM_CUDA_ARCHITECTURES="${KVMM_GPU_ARCHS:-90}" -DKVMM_BUILD_TESTS=OFF -DKVMM_BUILD_BENCH=ON \
    -DKVMM_BUILD_EXAMPLES=OFF -DKVMM_PYTHON=OFF || return 1
  step build 200 "$out/build.log" cmake --build "$B" -j"$(nproc)" --target bench_kernels
}

# The tensor-core decode's limiter (issue 36): the probes (decode_paged_tc_loadonly: the same
# cp.async ring without math; _mathonly: the same loop without K/V loads; _plain: the copy lane
# map shipped before the sector map, 24 L1 sectors per K/V request) beside the default and contiguous tc rows and
# 16-token tiles at full waves (batch 256) and the read-pattern rows (issue 36's H2: head-major
# pages _hnd, one kv head _kv1, heads across warps _hw), then ncu on seven kernels (the
# read-pattern ones second and third) and every stall reason of two.
limiter() {
  local filter='copy_d2d|decode_paged_tc_(loadonly|mathonly|plain)/batch:(16|64|256)/ctx:(4096|32768)/tpp:16/|decode_paged_tc/batch:(16|64|256)/ctx:(4096|32768)/tpp:16/|decode_contiguous_tc/batch:(16|64|256)/ctx:(4096|32768)/|decode_paged_tc_t16/batch:256/ctx:(4096|32768)/tpp:16/|decode_paged/batch:64/ctx:4096/tpp:16/|decode_paged_tc_(hnd|kv1)/batch:(16|64|256)/ctx:(4096|32768)/tpp:16/|decode_contiguous_tc_hnd/batch:(16|64|256)/ctx:(4096|32768)/|decode_paged_hnd/batch:64/ctx:4096/tpp:16/|decode_(paged|contiguous)_tc_hw/batch:(16|64|256)/ctx:(4096|32768)/(tpp:16/)?'
  step bench 150 "$out/bench.txt" "$B/bench/kernels/bench_kernels" --benchmark_filter="$filter" --benchmark_min_time=0.2
  python3 bench/kernels/bench_table.py "$out/bench.txt" | tee -a "$sum"
  local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__warps_eligible.avg.per_cycle_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  local kernels='attention_kernel|tc_decode_kernel|tc_decode_probe_kernel|tc_decode_hw_kernel' f
  for f in 'decode_paged_tc/batch:64/ctx:4096/tpp:16/' 'decode_paged_tc_hw/batch:64/ctx:4096/tpp:16/' \
    'decode_paged_tc_hnd/batch:64/ctx:4096/tpp:16/' 'decode_paged_tc_loadonly/batch:64/ctx:4096/tpp:16/' \
    'decode_paged_tc_plain/batch:64/ctx:4096/tpp:16/' 'decode_contiguous_tc/batch:64/ctx:4096/' \
    'decode_paged/batch:64/ctx:4096/tpp:16/'; do
    step "ncu $f" 40 "$out/ncu.txt" ncu --clock-control none --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis_Tables --section Occupancy --metrics "$metrics" -k regex:"$kernels" \
      --launch-skip 2 --launch-count 1 "$B/bench/kernels/bench_kernels" --benchmark_filter="$f" \
      --benchmark_min_time=0.01
  done
  # Every stall reason of the default kernel and the load-only probe (a second pass: a metric
  # name this ncu lacks fails only this step).
  for f in 'decode_paged_tc/batch:64/ctx:4096/tpp:16/' 'decode_paged_tc_loadonly/batch:64/ctx:4096/tpp:16/'; do
    step "ncu stalls $f" 40 "$out/ncu_stalls.txt" ncu --clock-control none \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' -k regex:"$kernels" \
      --launch-skip 2 --launch-count 1 "$B/bench/kernels/bench_kernels" --benchmark_filter="$f" \
      --benchmark_min_time=0.01
  done
  grep -E '^  [a-z_]+(<|\()|tc_decode|attention_kernel|gpu__time|dram__|inst_executed.sum|warps_eligible|warps_active|l1tex__t_|lts__t_|hmma|Warp Cycles Per|Issued Warp|Eligible Warps|No Eligible|Achieved Occupancy|Theoretical Occupancy|Block Limit Shared|Global Load|LDGSTS|cycles being stalled|excessive sectors|uncoalesced' \
    "$out/ncu.txt" | head -150 >>"$sum"
  grep -E 'tc_decode|stalled_(long_scoreboard|barrier|short_scoreboard|wait|math_pipe_throttle|mio_throttle|lg_throttle|not_selected|selected|dispatch_stall|no_instruction|drain|membar|branch_resolving|sleeping|tex_throttle|imc_miss|misc)_per' \
    "$out/ncu_stalls.txt" | head -60 >>"$sum"
}

profile_ncu() {
  local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__warps_eligible.avg.per_cycle_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__sass_inst_executed_op_ldsm.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex_op_read.sum
  local f
  for f in 'decode_paged/batch:64/ctx:4096/tpp:16/' 'decode_paged_tc/batch:64/ctx:4096/tpp:16/' 'prefill_paged/chunk:2048/ctx:8192/' 'prefill_paged_tc/chunk:2048/ctx:8192/'; do
    step "ncu $f" 100 "$out/ncu.txt" ncu --clock-control none --metrics "$metrics" -k regex:'attention_kernel|tc_decode_kernel|tc_prefill_kernel' \
      --launch-skip 2 --launch-count 1 "$B/bench/kernels/bench_kernels" --benchmark_filter="$f" \
      --benchmark_min_time=0.01 || break
  done
  grep -E 'attention_kernel|tc_decode_kernel|tc_prefill_kernel|dram__throughput|dram__bytes_read|smsp__inst_executed.sum|warps_eligible|hmma|bank_conflicts|gpu__time' \
    "$out/ncu.txt" | head -60 >>"$sum"
}

case $mode in
  limiter)
    build_bench || {
      tail -40 "$out/build.log"
      exit 1
    }
    limiter
    ;;
  core | all)
    build || {
      tail -40 "$out/build.log"
      exit 1
    }
    census
    step gpu-tests 90 "$out/tests.log" "$B/tests/kvmm_test_gpu"
    tail -3 "$out/tests.log" >>"$sum"
    bench
    if [[ -f $B/kernels_census.json ]]; then
      step model 20 "$sum" python3 bench/kernels/model.py --table --check --census "$B/kernels_census.json" \
        --measured "$out/bench.txt" --measured-tc "$out/bench.txt"
    fi
    ;;&
  cudnn) # cuDNN's paged SDPA: its own build flags, in the same build folder
    # cuDNN: KVMM_CUDNN_ROOT, else python3's nvidia-cudnn package (torch's), else any
    # site-packages nvidia/**/libcudnn.so.9, else the CUDA toolkit's (empty root)
    croot=${KVMM_CUDNN_ROOT:-$(python3 -c 'import glob, os, site
try:
    import nvidia.cudnn as m
    print(list(m.__path__)[0])
except ImportError:
    hits = [f for d in site.getsitepackages() for f in glob.glob(d + "/nvidia/**/libcudnn.so.9", recursive=True)]
    print(os.path.dirname(os.path.dirname(hits[0])) if hits else "")' 2>/dev/null)}
    fe=$(realpath -m "${KVMM_CUDNN_FRONTEND_INCLUDE:-.device-kit/cudnn-frontend/include}")
    say "- cudnn: root '${croot:-none (CUDA toolkit)}', frontend $fe"
    step configure 90 "$out/build.log" cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DKVMM_CUDA=ON \
      -DKVMM_CUDA_ARCHITECTURES="${KVMM_GPU_ARCHS:-90}" -DKVMM_BUILD_TESTS=ON -DKVMM_BUILD_BENCH=ON \
      -DKVMM_BUILD_EXAMPLES=OFF -DKVMM_PYTHON=OFF -DKVMM_CUDNN=ON -DKVMM_CUDNN_ROOT="$croot" \
      -DKVMM_CUDNN_FRONTEND_INCLUDE_DIR="$fe" || {
      tail -30 "$out/build.log" | tee -a "$sum"
      exit 1
    }
    grep -E 'kvmm: cuDNN' "$out/build.log" >>"$sum"
    step build 200 "$out/build.log" cmake --build "$B" -j"$(nproc)" --target kvmm_test_gpu_cudnn bench_kernels || {
      grep -E 'error|Error' "$out/build.log" | head -30 | tee -a "$sum"
      exit 1
    }
    # libcudnn's sub-libraries (and the runtime-compiled engines' nvrtc) beside it / in the toolkit
    export LD_LIBRARY_PATH="${croot:+$croot/lib:}${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # cuDNN's own log at level 2 (errors and warnings: why an engine refuses a graph) to the log
    step cudnn-test 100 "$out/tests.log" env CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr "$B/tests/kvmm_test_gpu_cudnn"
    grep -E '^cuDNN|^cudnn|FAILED|passed|failed' "$out/tests.log" | head -40 >>"$sum"
    grep -m 12 -E '^(E|W)! ' "$out/tests.log" | cut -c1-300 >>"$sum"
    step bench 50 "$out/bench.txt" "$B/bench/kernels/bench_kernels" --benchmark_min_time=0.2 \
      --benchmark_filter='prefill_paged_(tc|tc32_1|cudnn|cudnn_hm)/chunk:(512|2048)/ctx:(2048|8192)/'
    grep -E 'cuDNN|prefill_paged' "$out/bench.txt" | cut -c1-200 >>"$sum"
    ;;
  profile | all)
    build || exit 1
    step sdpa 90 "$out/sdpa.txt" env PYTHONUNBUFFERED=1 python3 bench/kernels/sdpa_bench.py
    tail -24 "$out/sdpa.txt" >>"$sum"
    if [[ $(uname -r) == 4.4.0* ]]; then # gVisor (the H200 machines): no hardware counters, no sanitizer
      say "- ncu, compute-sanitizer: skipped, gVisor runtime ($(uname -r)) exposes neither"
    else
      profile_ncu
      step racecheck 80 "$out/sanitizer.txt" compute-sanitizer --tool racecheck --error-exitcode 3 "$B/tests/kvmm_test_gpu" "[sanitize]"
      step synccheck 60 "$out/sanitizer.txt" compute-sanitizer --tool synccheck --error-exitcode 3 "$B/tests/kvmm_test_gpu" "[sanitize]"
      grep -E 'SUMMARY|not supported' "$out/sanitizer.txt" >>"$sum"
    fi
    ;;
esac
say "total $((SECONDS - start)) s"
