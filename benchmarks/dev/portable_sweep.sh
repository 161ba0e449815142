#!/bin/bash
# Device-side driver for portable_sweep.cu: builds the baseline kernel (see below) and the
# variants given as "name:BM,BN,BK,WARPS_M,WARPS_N,STAGES,MIN_BLOCKS" in parallel, runs each
# (checks + timings), compute-sanitizer on those named in $SANITIZE, Nsight Compute on those
# in $NCU (stall reasons per issued instruction, tensor-pipe activity, L2 requests).
# "old" is a baseline header with the original 5-parameter PortableConfig (d33a68d; NO_OLD=1
# skips it); variant names starting with o_ are built against a 7-parameter baseline header.
#   OLD_REV=d33a68d NCU="old v1" bash benchmarks/dev/portable_sweep.sh OUTDIR v1:128,256,64,2,4,3,1 ...
out=$1; shift
mkdir -p "$out" /tmp/pbin
# The baseline: cuda/matmul_portable.cuh of git $OLD_REV, or as found in benchmarks/dev/
# portable_old (the device copy of the tree has no .git).
old=benchmarks/dev/portable_old
if [ -n "$OLD_REV" ]; then mkdir -p $old/cuda; git show $OLD_REV:csrc/cuda/matmul_portable.cuh > $old/cuda/matmul_portable.cuh; fi
NV="nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Xptxas -v"
names=()
if [ -z "$NO_OLD" ]; then
  $NV -DOLD_KERNEL -I$old -Icsrc benchmarks/dev/portable_sweep.cu -o /tmp/pbin/old > "$out/build_old.txt" 2>&1 &
  names+=(old)
fi
for v in "$@"; do
  n=${v%%:*}; IFS=, read bm bn bk wm wn st mb <<< "${v#*:}"; inc=-Icsrc
  [ "${n#o_}" != "$n" ] && inc="-I$old -Icsrc"
  # Per variant: INC_<name> (a directory holding another cuda/matmul_portable.cuh),
  # PATCH_<name> (a patch of csrc/cuda/matmul_portable.cuh, e.g. portable_r3_early.patch, for
  # a header built in /tmp) and FLAGS_<name> (extra nvcc flags, e.g. -D switches).
  ivar=INC_$n; fvar=FLAGS_$n; pvar=PATCH_$n; [ -n "${!ivar}" ] && inc="${!ivar} -Icsrc"
  if [ -n "${!pvar}" ]; then
    mkdir -p /tmp/pinc_$n/cuda && cp csrc/cuda/matmul_portable.cuh /tmp/pinc_$n/cuda/
    patch -s -p1 -d /tmp/pinc_$n < "${!pvar}" || { echo "== $n: patch failed"; continue; }
    inc="-I/tmp/pinc_$n -Icsrc"
  fi
  $NV $inc ${!fvar} -DV_BM=$bm -DV_BN=$bn -DV_BK=$bk -DV_WM=$wm -DV_WN=$wn -DV_ST=$st -DV_MB=$mb \
      benchmarks/dev/portable_sweep.cu -o /tmp/pbin/$n > "$out/build_$n.txt" 2>&1 &
  names+=($n)
done
wait
# $WAIT_FILE: wait for it to exist before timing (e.g. a parallel extension build's end).
while [ -n "$WAIT_FILE" ] && [ ! -e "$WAIT_FILE" ]; do sleep 1; done
# Binaries in /tmp (only text comes back); full outputs in OUTDIR, a summary on stdout.
for n in "${names[@]}"; do
  echo "== $n $(grep -E 'registers|spill' "$out/build_$n.txt" | grep -oE '[0-9]+ bytes spill loads|Used [0-9]+ registers' | paste -sd' ')"
  if [ -x /tmp/pbin/$n ]; then /tmp/pbin/$n > "$out/run_$n.txt" 2>&1; grep -E "FAIL|TFLOP|ALL|error" "$out/run_$n.txt"; else tail -3 "$out/build_$n.txt"; fi
done
for n in $SANITIZE; do
  echo "== compute-sanitizer $n: $(compute-sanitizer --tool memcheck /tmp/pbin/$n check 2>&1 | tail -2 | paste -sd' ')"
done
for n in $NCU; do
  ncu --clock-control none --kernel-name regex:portable --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,lts__t_requests.sum,lts__t_sectors.sum" \
      /tmp/pbin/$n ncu > "$out/ncu_$n.txt" 2>&1
  echo "== ncu $n: $(grep -E '^ +(Duration|SM Frequency|L2 Cache Throughput|Issue Slots Busy|Warp Cycles Per Issued Instruction) ' "$out/ncu_$n.txt" | awk '{print $1,$2,$NF}' | paste -sd' ')"
  grep -E "hmma_cycles_active.avg|inst_executed.sum|lts__t_(requests|sectors).sum" "$out/ncu_$n.txt" | awk '{print "   ",$1,$NF}'
  grep -E "stalled_.*ratio" "$out/ncu_$n.txt" | awk '$NF+0 >= 0.1 {sub("smsp__average_warps_issue_stalled_","",$1); sub("_per_issue_active.ratio","",$1); printf "  %s=%s", $1, $NF} END {print ""}'
done
