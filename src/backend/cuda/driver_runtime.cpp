// DeviceRuntime on a real GPU through the CUDA driver API (loaded at run time, see driver.h): the
// retained primary context, one non-blocking stream, device and pinned allocations freed with the
// runtime, NVRTC (disk-cached) for the module, cooperative launches for the megakernel.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

#include "backend/cuda/device_runtime.h"
#include "backend/cuda/driver.h"
#include "backend/cuda/nvrtc.h"
#include "support/env.h"
#include "support/error.h"

namespace mk::cuda {

#if MK_HAVE_NVRTC

namespace {

class DriverRuntime final : public DeviceRuntime {
 public:
  DriverRuntime() {
    std::string reason;
    if (!cuda_available(&reason)) fail("no CUDA driver: {}", reason);
    MK_CU(cuDeviceGet, &dev_, static_cast<int>(env_int("MK_CUDA_DEVICE", 0, 0, 1023)));
    int smem_optin = 0;
    MK_CU(cuDeviceGetAttribute, &info_.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev_);
    MK_CU(cuDeviceGetAttribute, &info_.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev_);
    MK_CU(cuDeviceGetAttribute, &info_.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev_);
    MK_CU(cuDeviceGetAttribute, &smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev_);
    info_.smem_optin = smem_optin;
    char name[256] = {};
    MK_CU(cuDeviceGetName, name, static_cast<int>(sizeof name), dev_);
    info_.name = name;
    MK_CU(cuDevicePrimaryCtxRetain, &ctx_, dev_);
    MK_CU(cuCtxSetCurrent, ctx_);
    MK_CU(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
  }
  ~DriverRuntime() override {
    // Errors here cannot be reported; free what was made, context last.
    const auto& d = driver();
    if (ctx_) d.cuCtxSetCurrent(ctx_);
    if (stream_) d.cuStreamSynchronize(stream_);
    if (graph_exec_) d.cuGraphExecDestroy(graph_exec_);
    if (graph_) d.cuGraphDestroy(graph_);
    if (stream_) d.cuStreamDestroy(stream_);
    if (module_) d.cuModuleUnload(module_);
    for (CUdeviceptr p : device_) d.cuMemFree(p);
    for (void* p : host_) d.cuMemFreeHost(p);
    if (ctx_) d.cuDevicePrimaryCtxRelease(dev_);
  }

  const DeviceInfo& info() const override { return info_; }

  uint64_t alloc(size_t bytes) override {
    current();
    CUdeviceptr p = 0;
    const size_t n = std::max<size_t>(bytes, 256);
    MK_CU(cuMemAlloc, &p, n);
    device_.push_back(p);
    MK_CU(cuMemsetD8, p, 0, n);
    return p;
  }
  void* host_alloc(size_t bytes, uint64_t* device_alias) override {
    current();
    void* p = nullptr;
    const size_t n = std::max<size_t>(bytes, 64);
    MK_CU(cuMemHostAlloc, &p, n, device_alias ? CU_MEMHOSTALLOC_DEVICEMAP : 0u);
    host_.push_back(p);
    std::memset(p, 0, n);
    if (device_alias) {
      CUdeviceptr d = 0;
      MK_CU(cuMemHostGetDevicePointer, &d, p, 0);
      *device_alias = d;
    }
    return p;
  }
  void memset0(uint64_t dst, size_t bytes) override {
    current();
    MK_CU(cuMemsetD8Async, dst, 0, bytes, stream_);
  }
  void copy_to_device(uint64_t dst, const void* src, size_t bytes, bool async) override {
    current();
    if (async) MK_CU(cuMemcpyHtoDAsync, dst, src, bytes, stream_);
    else MK_CU(cuMemcpyHtoD, dst, src, bytes);
  }
  void copy_on_device(uint64_t dst, uint64_t src, size_t bytes) override {
    current();
    MK_CU(cuMemcpyDtoDAsync, dst, src, bytes, stream_);
  }
  void copy_to_host(void* dst, uint64_t src, size_t bytes, bool async) override {
    current();
    if (async) MK_CU(cuMemcpyDtoHAsync, dst, src, bytes, stream_);
    else MK_CU(cuMemcpyDtoH, dst, src, bytes);
  }

  ModuleInfo load(const CudaSource& src, const Program&) override {
    current();
    NvrtcOptions no;
    no.arch = arch_for_compute_capability(info_.cc_major, info_.cc_minor);
    no.name = "megakernel.cu";
    NvrtcResult built = compile_to_cubin(src.code, no);
    MK_CU(cuModuleLoadData, &module_, built.cubin.data());
    ModuleInfo mi;
    mi.compile_ms = built.compile_ms;
    mi.from_cache = built.from_cache;
    mi.what = "NVRTC";
    smem_ = static_cast<int>(src.smem_bytes);
    return mi;
  }

  int max_resident_blocks(const std::string& kernel, int threads, size_t smem_bytes) override {
    CUfunction fn = function(kernel);
    int per_sm = 0;
    MK_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, &per_sm, fn, threads, smem_bytes);
    return per_sm * info_.sms;
  }

  void launch(const std::string& kernel, unsigned grid, unsigned threads, size_t smem_bytes, const MkParams& params, int first,
              bool cooperative) override {
    current();
    CUfunction fn = function(kernel);
    MkParams prm = params;
    void* argv1[] = {&prm};
    void* argv2[] = {&prm, &first};
    if (cooperative)
      MK_CU(cuLaunchCooperativeKernel, fn, grid, 1, 1, threads, 1, 1, static_cast<unsigned>(smem_bytes), stream_,
            first >= 0 ? argv2 : argv1);
    else
      MK_CU(cuLaunchKernel, fn, grid, 1, 1, threads, 1, 1, static_cast<unsigned>(smem_bytes), stream_, first >= 0 ? argv2 : argv1,
            nullptr);
  }

  void begin_capture() override {
    current();
    MK_CU(cuStreamBeginCapture, stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  }
  void end_capture() override {
    MK_CU(cuStreamEndCapture, stream_, &graph_);
    MK_CU(cuGraphInstantiate, &graph_exec_, graph_, 0);
  }
  void replay() override {
    current();
    MK_CU(cuGraphLaunch, graph_exec_, stream_);
  }
  std::string synchronize() override {
    current();
    const CUresult r = driver().cuStreamSynchronize(stream_);
    return r == CUDA_SUCCESS ? "" : "cuStreamSynchronize: " + error_text(r);
  }

 private:
  void current() { MK_CU(cuCtxSetCurrent, ctx_); }
  // Kernels by name; the dynamic shared memory attribute is set once per function.
  CUfunction function(const std::string& name) {
    auto it = functions_.find(name);
    if (it != functions_.end()) return it->second;
    if (!module_) fail("cuda: {} requested before the module is loaded", name);
    CUfunction fn = nullptr;
    MK_CU(cuModuleGetFunction, &fn, module_, name.c_str());
    MK_CU(cuFuncSetAttribute, fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_);
    functions_.emplace(name, fn);
    return fn;
  }

  DeviceInfo info_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  CUmodule module_ = nullptr;
  CUgraph graph_ = nullptr;
  CUgraphExec graph_exec_ = nullptr;
  int smem_ = 0;
  std::map<std::string, CUfunction> functions_;
  std::vector<CUdeviceptr> device_;
  std::vector<void*> host_;
};

}  // namespace

std::unique_ptr<DeviceRuntime> make_driver_runtime() { return std::make_unique<DriverRuntime>(); }

#else  // !MK_HAVE_NVRTC

std::unique_ptr<DeviceRuntime> make_driver_runtime() {
  std::string reason;
  cuda_available(&reason);
  fail("no CUDA driver: {}", reason);
}

#endif

}  // namespace mk::cuda
