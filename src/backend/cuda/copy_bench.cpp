#include "backend/cuda/copy_bench.h"

#include <algorithm>
#include <vector>

#include "backend/cuda/driver.h"
#include "support/error.h"

namespace mk::cuda {

#if MK_HAVE_NVRTC

CopyBandwidth measure_copy_bandwidth(size_t bytes, int reps) {
  std::string reason;
  if (!cuda_available(&reason)) fail("no CUDA driver: {}", reason);
  if (bytes < 4096 || reps < 1) fail("bench-copy: need at least 4096 bytes and one repetition");
  const auto& d = driver();
  CopyBandwidth r;
  r.bytes = bytes;
  r.reps = reps;
  CUdevice dev = 0;
  MK_CU(cuDeviceGet, &dev, 0);
  char name[256] = {};
  MK_CU(cuDeviceGetName, name, static_cast<int>(sizeof name), dev);
  r.device = name;
  CUcontext ctx = nullptr;
  MK_CU(cuDevicePrimaryCtxRetain, &ctx, dev);
  CUdeviceptr a = 0, b = 0;
  CUstream stream = nullptr;
  CUevent e0 = nullptr, e1 = nullptr;
  // Frees what was created, also when a call below throws.
  struct Cleanup {
    const DriverApi& d;
    CUdevice dev;
    CUdeviceptr& a;
    CUdeviceptr& b;
    CUstream& s;
    CUevent& e0;
    CUevent& e1;
    ~Cleanup() {
      if (e0) d.cuEventDestroy(e0);
      if (e1) d.cuEventDestroy(e1);
      if (s) d.cuStreamDestroy(s);
      if (a) d.cuMemFree(a);
      if (b) d.cuMemFree(b);
      d.cuDevicePrimaryCtxRelease(dev);
    }
  } cleanup{d, dev, a, b, stream, e0, e1};
  MK_CU(cuCtxSetCurrent, ctx);
  MK_CU(cuMemAlloc, &a, bytes);
  MK_CU(cuMemAlloc, &b, bytes);
  MK_CU(cuMemsetD8, a, 1, bytes);
  MK_CU(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  MK_CU(cuEventCreate, &e0, CU_EVENT_DEFAULT);
  MK_CU(cuEventCreate, &e1, CU_EVENT_DEFAULT);
  MK_CU(cuMemcpyDtoDAsync, b, a, bytes, stream);  // warm-up
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    MK_CU(cuEventRecord, e0, stream);
    MK_CU(cuMemcpyDtoDAsync, (i & 1) ? a : b, (i & 1) ? b : a, bytes, stream);
    MK_CU(cuEventRecord, e1, stream);
    MK_CU(cuEventSynchronize, e1);
    float t = 0;
    MK_CU(cuEventElapsedTime, &t, e0, e1);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  r.ms_per_copy = ms[ms.size() / 2];
  r.gbps = r.ms_per_copy > 0 ? 2.0 * static_cast<double>(bytes) / (r.ms_per_copy * 1e-3) / 1e9 : 0;
  return r;
}

#else

CopyBandwidth measure_copy_bandwidth(size_t, int) {
  std::string reason;
  cuda_available(&reason);
  fail("no CUDA driver: {}", reason);
}

#endif

}  // namespace mk::cuda
