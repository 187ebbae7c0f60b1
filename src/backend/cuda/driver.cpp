#include "backend/cuda/driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "support/error.h"

namespace mk::cuda {

#if MK_HAVE_NVRTC

namespace {

#define MK_STR_(x) #x
#define MK_STR(x) MK_STR_(x)

struct Loaded {
  DriverApi api;
  bool ok = false;
  std::string reason;  // why !ok
};

// "NAME (description)" from the driver, with fallbacks for the codes a broken setup gives (the
// toolkit's stub library answers cuGetErrorName with an error too).
std::string describe(const DriverApi& api, CUresult r) {
  const char *name = nullptr, *desc = nullptr;
  if (api.cuGetErrorName && api.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (api.cuGetErrorString && api.cuGetErrorString(r, &desc) != CUDA_SUCCESS) desc = nullptr;
  if (name) return fmt::format("{} ({})", name, desc ? desc : "no description");
  switch (r) {
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY (this libcuda is the toolkit's stub, not a driver)";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE (no CUDA-capable device)";
    default: return fmt::format("CUDA error {}", static_cast<int>(r));
  }
}

// Loads the library, resolves the table, runs cuInit and counts devices. Never throws.
Loaded load_driver() {
  Loaded l;
  const char* override_path = std::getenv("MK_CUDA_DRIVER");
  const char* lib = override_path && *override_path ? override_path : "libcuda.so.1";
  // RTLD_NOW: a library with missing symbols fails here, not at the first call.
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    l.reason = fmt::format("cannot load {}: {}", lib, e ? e : "unknown dlopen error");
    return l;
  }
  // The handle is kept for the life of the process: the driver cannot be safely unloaded.
  std::string missing;
#define MK_CU_RESOLVE(fn)                                                                     \
  l.api.fn = reinterpret_cast<decltype(l.api.fn)>(dlsym(h, MK_STR(fn)));                      \
  if (!l.api.fn) missing += (missing.empty() ? "" : ", ") + std::string(MK_STR(fn));
  MK_CU_FUNCTIONS(MK_CU_RESOLVE)
#undef MK_CU_RESOLVE
  if (!missing.empty()) {
    l.reason = fmt::format("{} lacks {} (driver older than the CUDA {}.{} headers this was built with?)", lib,
                           missing, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
    return l;
  }
  CUresult r = l.api.cuInit(0);
  if (r != CUDA_SUCCESS) {
    l.reason = fmt::format("cuInit: {}", describe(l.api, r));
    return l;
  }
  l.api.cuDriverGetVersion(&l.api.driver_version);
  int count = 0;
  r = l.api.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS || count <= 0) {
    l.reason = r != CUDA_SUCCESS ? fmt::format("cuDeviceGetCount: {}", describe(l.api, r))
                                 : std::string("no CUDA device found");
    return l;
  }
  l.ok = true;
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load_driver();  // thread-safe one-time initialisation
  return l;
}

}  // namespace

bool cuda_available(std::string* reason) {
  const Loaded& l = loaded();
  if (reason) *reason = l.ok ? std::string() : l.reason;
  return l.ok;
}

const DriverApi& driver() {
  const Loaded& l = loaded();
  if (!l.ok) fail("no CUDA driver: {}", l.reason);
  return l.api;
}

std::string error_text(CUresult r) { return describe(loaded().api, r); }

void check(CUresult r, const char* call, const char* file, int line) {
  if (r == CUDA_SUCCESS) return;
  fail("{}: {} at {}:{}", call, error_text(r), file, line);
}

#else  // !MK_HAVE_NVRTC

bool cuda_available(std::string* reason) {
  if (reason) *reason = "built without the CUDA toolkit headers (MK_HAVE_NVRTC is off)";
  return false;
}

#endif

}  // namespace mk::cuda
