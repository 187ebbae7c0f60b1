#include "backend/cuda/nvrtc.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/ranges.h>

#include "support/env.h"
#include "support/error.h"
#include "support/hash.h"

#if MK_HAVE_NVRTC
#include <nvrtc.h>
#endif

namespace mk::cuda {

namespace {

std::atomic<uint64_t> g_compile_count{0};

// Options every compilation gets; part of the cache key.
std::vector<std::string> default_flags() { return {"-std=c++17", "-lineinfo"}; }

// Cache file layout: magic, key, payload size, payload (the CUBIN). Little-endian host order; the
// cache is per machine.
constexpr char kMagic[8] = {'M', 'K', 'C', 'U', 'B', 'N', '0', '1'};

std::vector<char> read_cache(const std::string& path, uint64_t key) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  char magic[8];
  uint64_t k = 0, size = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&k), 8);
  f.read(reinterpret_cast<char*>(&size), 8);
  if (!f || std::memcmp(magic, kMagic, 8) != 0 || k != key || size == 0 || size > (1ull << 31)) return {};
  std::vector<char> data(size);
  f.read(data.data(), static_cast<std::streamsize>(size));
  if (!f || f.peek() != std::ifstream::traits_type::eof()) return {};
  return data;
}

// Writes to a unique temp file in the same folder, then renames: readers see the old file, no
// file, or the whole new one; concurrent writers of one key each write the same bytes.
bool write_cache(const std::string& dir, const std::string& path, uint64_t key, const std::vector<char>& data) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return false;
  std::random_device rd;
  std::string tmp = fmt::format("{}.tmp.{}.{:08x}", path, static_cast<long>(getpid()), rd());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return false;
    uint64_t size = data.size();
    f.write(kMagic, 8);
    f.write(reinterpret_cast<const char*>(&key), 8);
    f.write(reinterpret_cast<const char*>(&size), 8);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    f.flush();
    if (!f) {
      f.close();
      std::filesystem::remove(tmp, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return false;
  }
  return true;
}

bool cache_enabled(const NvrtcOptions& o) {
  return env_flag("MK_CUDA_CACHE", true) && o.use_cache;
}

}  // namespace

std::string default_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/megakernel";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/megakernel";
  return {};
}

uint64_t nvrtc_compile_count() { return g_compile_count.load(); }

std::string arch_for_compute_capability(int major, int minor) { return fmt::format("sm_{}{}", major, minor); }

uint64_t cubin_cache_key(const std::string& source, const NvrtcOptions& o) {
  Fnv1a64 h;
  h.field("megakernel-cubin-v1").field(nvrtc_version()).field(o.arch);
  for (const auto& f : default_flags()) h.field(f);
  h.field("|");
  for (const auto& f : o.flags) h.field(f);
  h.field(source);
  return h.value();
}

#if MK_HAVE_NVRTC

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return fmt::format("{}.{}", major, minor);
}

// Runs NVRTC on `source` for `arch` (sm_XX: a CUBIN into res.cubin; compute_XX with ptx: PTX text
// into res.ptx), with its log and time in res. Throws mk::Error with NVRTC's log on a compile error.
static void nvrtc_compile(const std::string& source, const NvrtcOptions& o, const std::string& arch, NvrtcResult& res,
                   bool ptx = false) {
  auto check_nvrtc = [&](nvrtcResult r, const char* call) {
    if (r != NVRTC_SUCCESS) fail("NVRTC: {} for {} ({}): {}", call, o.name, o.arch, nvrtcGetErrorString(r));
  };
  nvrtcProgram prog = nullptr;
  check_nvrtc(nvrtcCreateProgram(&prog, source.c_str(), o.name.c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram");
  // Destroys the program on every path out, including exceptions.
  struct Guard {
    nvrtcProgram* p;
    ~Guard() { nvrtcDestroyProgram(p); }
  } guard{&prog};

  std::vector<std::string> opts = {"--gpu-architecture=" + arch};
  for (const auto& f : default_flags()) opts.push_back(f);
  for (const auto& f : o.flags) opts.push_back(f);
  std::vector<const char*> argv;
  for (const auto& s : opts) argv.push_back(s.c_str());

  auto t0 = std::chrono::steady_clock::now();
  nvrtcResult cr = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  res.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  g_compile_count.fetch_add(1);

  size_t log_size = 0;
  check_nvrtc(nvrtcGetProgramLogSize(prog, &log_size), "nvrtcGetProgramLogSize");
  std::string log(log_size, '\0');
  if (log_size > 1) check_nvrtc(nvrtcGetProgramLog(prog, log.data()), "nvrtcGetProgramLog");
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  if (cr != NVRTC_SUCCESS)
    fail("NVRTC: compiling {} for {} failed ({}); options: {}\n{}", o.name, arch, nvrtcGetErrorString(cr),
         fmt::format("{}", fmt::join(opts, " ")), log.empty() ? "(empty log)" : log);
  res.log = std::move(log);

  if (ptx) {
    size_t ptx_size = 0;
    check_nvrtc(nvrtcGetPTXSize(prog, &ptx_size), "nvrtcGetPTXSize");
    res.ptx.assign(ptx_size, '\0');
    if (ptx_size) check_nvrtc(nvrtcGetPTX(prog, res.ptx.data()), "nvrtcGetPTX");
    while (!res.ptx.empty() && res.ptx.back() == '\0') res.ptx.pop_back();
    return;
  }
  size_t cubin_size = 0;
  check_nvrtc(nvrtcGetCUBINSize(prog, &cubin_size), "nvrtcGetCUBINSize");
  if (cubin_size == 0)
    fail("NVRTC: {} for {} produced no CUBIN (is '{}' a real architecture, not compute_XX?)", o.name, o.arch, o.arch);
  res.cubin.resize(cubin_size);
  check_nvrtc(nvrtcGetCUBIN(prog, res.cubin.data()), "nvrtcGetCUBIN");

}

NvrtcResult compile_to_cubin(const std::string& source, const NvrtcOptions& o) {
  NvrtcResult res;
  res.key = cubin_cache_key(source, o);
  const bool use_cache = cache_enabled(o);
  const std::string dir = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  const std::string path = use_cache && !dir.empty() ? fmt::format("{}/{:016x}-{}.cubin", dir, res.key, o.arch) : "";
  if (!path.empty()) {
    res.cubin = read_cache(path, res.key);
    if (!res.cubin.empty()) {
      res.from_cache = true;
      res.cache_path = path;
      return res;
    }
  }

  nvrtc_compile(source, o, o.arch, res);
  if (!path.empty() && write_cache(dir, path, res.key, res.cubin)) res.cache_path = path;
  return res;
}

NvrtcResult compile_to_ptx(const std::string& source, const NvrtcOptions& o) {
  NvrtcResult res;
  std::string arch = o.arch;
  if (arch.rfind("sm_", 0) == 0) arch = "compute_" + arch.substr(3);
  nvrtc_compile(source, o, arch, res, /*ptx=*/true);
  if (res.ptx.empty()) fail("NVRTC: {} for {} produced no PTX", o.name, arch);
  return res;
}

#else  // !MK_HAVE_NVRTC

std::string nvrtc_version() { return {}; }

NvrtcResult compile_to_cubin(const std::string&, const NvrtcOptions& o) {
  fail("cannot compile {} for {}: megakernel was built without the CUDA toolkit (NVRTC)", o.name, o.arch);
}

NvrtcResult compile_to_ptx(const std::string&, const NvrtcOptions& o) {
  fail("cannot compile {} for {}: megakernel was built without the CUDA toolkit (NVRTC)", o.name, o.arch);
}

#endif

}  // namespace mk::cuda
