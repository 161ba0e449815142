// What a dispatch plan (cuda/<op>/plan.h) needs to know about the GPU, passed in rather than
// queried, so that a plan is a pure function a CPU test can call with any GPU's values.
#pragma once

namespace fused {

struct GpuProps {
  int major = 9, minor = 0;  // compute capability
  int num_sms = 132;
  // Whether the kernels' sm_90 code is what runs here (launch.cuh: runs_sm90_code): a
  // compute capability 9.0 GPU and a build with sm_90a. The cluster and bulk-copy kernels
  // compile to no-ops otherwise, so a plan never chooses them.
  bool sm90_code = true;
};

}  // namespace fused
