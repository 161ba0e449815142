#!/bin/bash
# Nsight Compute summary of the main kernel of each case (tools/probe.py), on the
# GPU machine: bash tools/ncu.sh OUTDIR "op shape pass" ...
# Clocks left alone (--clock-control none, as the device notes ask).
out=$1; shift
for c in "$@"; do
  set -- $c
  f="$out/ncu_$1_$2_$3.txt"
  ncu --clock-control none --launch-skip 2 --launch-count 1 \
      --kernel-name "regex:${NCU_KERNEL:-row_kernel|norm_|dropout_kernel}" \
      --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      python3 tools/probe.py $c > "$f" 2>&1
  echo "== $c"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Theoretical Occ|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall" "$f" | head -20
done
