// Device-to-device copy bandwidth, measured in the same process as a benchmark so that effective
// bandwidth figures (weight bytes per token / time per token) can be given as a share of what the
// memory system delivers on that device at that moment (TARGETS.md: "copy bandwidth measured in
// the same run").
#pragma once
#include <cstddef>
#include <string>

namespace mk::cuda {

struct CopyBandwidth {
  std::string device;       // cuDeviceGetName
  size_t bytes = 0;         // size of one copy
  int reps = 0;             // timed copies (after one untimed warm-up)
  double ms_per_copy = 0;   // median over reps, from CUDA events
  double gbps = 0;          // (bytes read + bytes written) / time = 2 * bytes / ms_per_copy, in GB/s (1e9)
};

// Copies `bytes` between two device buffers `reps` times (cuMemcpyDtoDAsync between events).
// Throws mk::Error ("no CUDA driver: ...") without a driver or GPU.
CopyBandwidth measure_copy_bandwidth(size_t bytes = size_t{1} << 30, int reps = 20);

}  // namespace mk::cuda
