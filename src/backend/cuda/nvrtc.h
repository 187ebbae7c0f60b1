// Run-time compilation of generated CUDA C++ to CUBIN with NVRTC, cached on disk.
//
// The megakernel's source is generated per Program (shapes baked in), so it is compiled at run time
// for the device's own architecture. Compiling takes seconds; the result is cached under
// $XDG_CACHE_HOME/megakernel (or ~/.cache/megakernel), keyed by FNV-1a 64 over the NVRTC version,
// the architecture, the options and the source. Entries are written atomically (temp file +
// rename) and carry their key and size, so a truncated or foreign file is ignored and rebuilt.
//
// No GPU or driver is needed: CI compiles generated sources to sm_90 on machines without one.
// Built without the toolkit (MK_HAVE_NVRTC off), compile_to_cubin throws mk::Error saying so.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mk::cuda {

struct NvrtcOptions {
  std::string arch = "sm_90";      // NVRTC --gpu-architecture: "sm_90", "sm_90a" (wgmma), "sm_80" ...
  std::vector<std::string> flags;  // extra options, appended after the defaults (-std=c++17 -lineinfo)
  std::string name = "megakernel.cu";  // the file name NVRTC uses in its log lines
  bool use_cache = true;           // also off when MK_CUDA_CACHE=0
  std::string cache_dir;           // "" = default_cache_dir()
};

struct NvrtcResult {
  std::vector<char> cubin;  // the ELF image for cuModuleLoadData
  std::string ptx;          // compile_to_ptx: the PTX text
  std::string log;          // NVRTC's warnings ("" when read from the cache)
  bool from_cache = false;
  uint64_t key = 0;          // the cache key
  std::string cache_path;    // the cache file (written or read); "" when caching is off or failed
  double compile_ms = 0;     // time spent in NVRTC (0 on a cache hit)
};

// Compiles `source` to a CUBIN for options.arch. Throws mk::Error on a compile error with NVRTC's
// whole log attached: "NVRTC: megakernel.cu for sm_90 failed (NVRTC_ERROR_COMPILATION):\n<log>".
// A cache that cannot be read or written is not an error: the source is compiled.
NvrtcResult compile_to_cubin(const std::string& source, const NvrtcOptions& options = {});

// NVRTC's front end only: `source` to PTX for the virtual architecture of options.arch (sm_90 ->
// compute_90), without ptxas and without the cache (CI checks that every generated source compiles;
// the PTX-to-CUBIN step, several times longer, is checked on the device shapes). Errors as above.
NvrtcResult compile_to_ptx(const std::string& source, const NvrtcOptions& options = {});

// The cache key for a source and options: stable across runs and machines with the same NVRTC.
uint64_t cubin_cache_key(const std::string& source, const NvrtcOptions& options);

// $XDG_CACHE_HOME/megakernel, else $HOME/.cache/megakernel, else "" (no cache).
std::string default_cache_dir();

// How many times this process has run NVRTC (cache misses). Tests use it to prove cache hits.
uint64_t nvrtc_compile_count();

// "13.0", or "" without NVRTC.
std::string nvrtc_version();

// The NVRTC architecture for a compute capability, e.g. (9, 0) -> "sm_90".
std::string arch_for_compute_capability(int major, int minor);

}  // namespace mk::cuda
