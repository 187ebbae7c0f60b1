// The CUDA driver API, loaded at run time.
//
// The binary never links libcuda: it dlopens "libcuda.so.1" on first use and resolves every entry
// point it needs into a table of function pointers typed from the toolkit's <cuda.h>. A machine
// without a GPU or driver therefore runs every other backend, and `--backend cuda` there fails with
// a clear "no CUDA driver: ..." error instead of a loader failure at start.
//
// Symbol versions: <cuda.h> maps names such as cuMemAlloc to their current ABI (cuMemAlloc_v2) with
// macros. The table resolves the macro-expanded name, exactly the symbol a program linked against
// libcuda with these headers would bind to, so each pointer's type matches its ABI.
//
// Every call goes through MK_CU(fn, args...), which throws mk::Error naming the call, the error name
// and the driver's description, e.g. "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory) at
// src/backend/cuda/cuda_backend.cpp:120".
//
// Needs the toolkit headers (MK_HAVE_NVRTC); without them only cuda_available() exists and says so.
#pragma once
#include <string>

#if MK_HAVE_NVRTC
#include <cuda.h>
#endif

namespace mk::cuda {

// True when the driver library loads, cuInit succeeds and at least one device exists. Otherwise
// false, with the reason in *reason ("libcuda.so.1: cannot open shared object file ...",
// "cuInit: CUDA_ERROR_NO_DEVICE ..."). Never throws; the result is computed once.
// MK_CUDA_DRIVER overrides the library path (tests use it to simulate a missing driver).
bool cuda_available(std::string* reason = nullptr);

#if MK_HAVE_NVRTC

// Entry points, one line each: name as written in code. Add a line to use another function.
#define MK_CU_FUNCTIONS(X)                                                                        \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                           \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem) \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxSynchronize)   \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetGlobal)                 \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchCooperativeKernel)        \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                                                   \
  X(cuMemAlloc) X(cuMemFree) X(cuMemAllocHost) X(cuMemFreeHost) X(cuMemGetInfo) X(cuMemHostAlloc)     \
  X(cuMemHostGetDevicePointer)                                                                    \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)         \
  X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD32) X(cuMemsetD8Async) X(cuMemsetD32Async)          \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamBeginCapture)               \
  X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy)                \
  X(cuGraphDestroy) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)       \
  X(cuEventElapsedTime)

// The resolved table. Member names are macro-expanded like the functions (cuMemAlloc is the member
// cuMemAlloc_v2), so `driver().cuMemAlloc(...)` reads like a normal driver call.
struct DriverApi {
#define MK_CU_MEMBER(fn) decltype(&::fn) fn = nullptr;
  MK_CU_FUNCTIONS(MK_CU_MEMBER)
#undef MK_CU_MEMBER
  int driver_version = 0;  // cuDriverGetVersion, e.g. 13000
};

// The loaded and initialised driver (cuInit done). Throws mk::Error "no CUDA driver: <reason>"
// when cuda_available() is false.
const DriverApi& driver();

// Throws mk::Error "<call>: <ERROR_NAME> (<description>) at <file>:<line>" unless r == CUDA_SUCCESS.
void check(CUresult r, const char* call, const char* file, int line);
// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; works for any code, also unknown ones.
std::string error_text(CUresult r);

#endif  // MK_HAVE_NVRTC

}  // namespace mk::cuda

#if MK_HAVE_NVRTC
// Calls a driver function through the table and checks its result.
#define MK_CU(fn, ...) ::mk::cuda::check(::mk::cuda::driver().fn(__VA_ARGS__), #fn, __FILE__, __LINE__)
#endif
