// What the CUDA backends need from a device, implemented twice: by the CUDA driver (a real GPU,
// driver_runtime.cpp) and by the emulator (cuda-emu, emu_runtime.cpp: the same generated source
// compiled for the host). Everything above this interface (compiling the Program, generating the
// source, the tables, staging, epochs, reading the error record) is one code path for both, so a
// step on cuda-emu runs the host code of a step on cuda up to the launch.
//
// Device pointers are 64-bit integers (CUdeviceptr on a GPU, host addresses on the emulator). Copies
// are ordered on one stream; copy_to_host(sync) and synchronize() wait for everything issued before.
// Errors throw mk::Error naming the call (MK_CU for the driver).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/codegen.h"

namespace mk {
struct Program;
}

namespace mk::cuda {

struct DeviceInfo {
  std::string name;       // "NVIDIA H200", "cuda-emu"
  int sms = 0;            // multiprocessors (the emulator: its default grid)
  int cc_major = 0, cc_minor = 0;
  int smem_optin = 0;     // dynamic shared memory per block, bytes
  int threads = 512;      // threads per block the kernels are generated for
};

struct ModuleInfo {
  double compile_ms = 0;  // 0 on a cache hit
  bool from_cache = false;
  std::string what;       // "NVRTC" or the host compiler
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual const DeviceInfo& info() const = 0;
  // Zero-filled device memory, freed with the runtime.
  virtual uint64_t alloc(size_t bytes) = 0;
  // Zero-filled pinned host memory; with device_alias, also mapped into the device's address space.
  virtual void* host_alloc(size_t bytes, uint64_t* device_alias) = 0;
  virtual void memset0(uint64_t dst, size_t bytes) = 0;
  virtual void copy_to_device(uint64_t dst, const void* src, size_t bytes, bool async) = 0;
  virtual void copy_to_host(void* dst, uint64_t src, size_t bytes, bool async) = 0;
  // Device to device, ordered on the stream like the others (several decode steps in flight hand
  // each step's chosen token to the next step's input this way; the emulator stamps the bytes as a
  // host-written input).
  virtual void copy_on_device(uint64_t dst, uint64_t src, size_t bytes) = 0;
  // Compiles (or takes from the disk cache) and loads the generated source.
  virtual ModuleInfo load(const CudaSource& src, const Program& program) = 0;
  // Blocks of `kernel` that can be resident on the whole device at once.
  virtual int max_resident_blocks(const std::string& kernel, int threads, size_t smem_bytes) = 0;
  // Launches `kernel` with MkParams (and `first`, for the per-op kernels, when >= 0). Cooperative
  // launches fail rather than run a grid that cannot be co-resident.
  virtual void launch(const std::string& kernel, unsigned grid, unsigned threads, size_t smem_bytes, const MkParams& params,
                      int first, bool cooperative) = 0;
  // Stream capture into a graph and its replay (cuda-graph); the emulator refuses.
  virtual void begin_capture() = 0;
  virtual void end_capture() = 0;
  virtual void replay() = 0;
  // Waits for the stream. "" when everything succeeded, else the error's text.
  virtual std::string synchronize() = 0;
  // Tells the runtime which device ranges hold the arena and the KV cache (the emulator's race check
  // stamps them), and that host copies into [dst, dst + bytes) are inputs of the next step.
  virtual void set_regions(uint64_t arena, size_t arena_bytes, uint64_t kv, size_t kv_bytes) {}
  // Text for an error record kind the runtime adds (the emulator: races); "" when not its kind.
  virtual std::string describe_error(const MkError& e, const Program& program) const { return ""; }
};

// The GPU through the driver. Throws "no CUDA driver: <reason>" without one.
std::unique_ptr<DeviceRuntime> make_driver_runtime();

struct EmuOptions {
  int blocks = 4;            // grid (co-resident blocks, one OS thread each)
  int threads = 128;         // threads per block (fibers)
  bool race_check = true;    // shadow stamps on every activation access
  std::string cxx;           // host compiler; "" = $MK_EMU_CXX, else c++
  std::string cache_dir;     // "" = default_cache_dir()/emu
};
// Options from the environment: MK_EMU_BLOCKS, MK_EMU_THREADS, MK_EMU_RACE_CHECK=0, MK_EMU_CXX.
EmuOptions emu_options_from_env(int blocks_default);
std::unique_ptr<DeviceRuntime> make_emu_runtime(const EmuOptions& options);

// How many times this process has run the host compiler for cuda-emu (tests prove cache hits).
uint64_t emu_compile_count();

}  // namespace mk::cuda

namespace mk {
class Backend;
struct BackendOptions;
class ModelFile;
// cuda-emu on a Program given as it is (no validator): the race-check tests run mutated programs.
std::unique_ptr<Backend> make_cuda_emu_program_backend(Program program, const ModelFile& model, const BackendOptions& options,
                                                       const cuda::EmuOptions& emu);
}  // namespace mk
