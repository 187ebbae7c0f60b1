// cuda-emu: the generated CUDA source compiled for the host and run with emulated blocks and threads
// (see device/emu_host.h for the execution model and the checks).
//
// The source (exactly what NVRTC gets) is wrapped as MK_EMU_HEAD + emu_host.h, source, MK_EMU_TAIL +
// emu_host.h, compiled by the host C++ compiler into a shared object and cached on disk like the
// cubin: <cache>/emu/<key>.so, key = FNV-1a 64 over the compiler, its version, the flags and the
// text. Written atomically (temp file + rename). ASan builds of megakernel compile the object with
// ASan too, so out-of-bounds accesses of the device code (global or shared memory) are reported.
//
// Device memory is host memory (256-byte aligned). The race check needs the happens-before
// relation of the program's instructions through its waits: hb[r] holds every instruction w with a
// chain of complete waits (count >= the counter's signallers) from w to r.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "backend/cuda/device_runtime.h"
#include "backend/cuda/nvrtc.h"
#include "isa/program.h"
#include "support/env.h"
#include "support/error.h"
#include "support/hash.h"

namespace mk::cuda {

namespace {

std::atomic<uint64_t> g_emu_compiles{0};

// Mirrors of emu_host.h's MkEmuHooks and MkEmuLaunch (same field order and types).
struct EmuHooks {
  int race_check;
  unsigned epoch;
  unsigned n_instrs;
  unsigned hb_words;
  const unsigned long long* hb;
  char* region_base[2];
  unsigned long long region_elems[2];
  unsigned long long* writer[2];
  unsigned long long* reader[2];
  void* error;
  volatile unsigned* abort_flag;
  unsigned long long spin_yield;
};
struct EmuLaunch {
  void (*megakernel)(const MkParams);
  void (*perop)(const MkParams, int);
  int first;
  const MkParams* params;
  unsigned grid, threads;
  unsigned long long smem_bytes, stack_bytes;
  EmuHooks* hooks;
};
using RunFn = void (*)(const EmuLaunch*);


// Runs a command; returns its exit status and its combined output.
int run_command(const std::string& cmd, std::string* output) {
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!f) fail("cuda-emu: cannot run '{}': {}", cmd, std::strerror(errno));
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) output->append(buf, n);
  const int st = ::pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

bool built_with_asan() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#else
  return false;
#endif
}

class EmuRuntime final : public DeviceRuntime {
 public:
  explicit EmuRuntime(const EmuOptions& o) : o_(o) {
    if (o_.blocks < 1 || o_.blocks > 256) fail("cuda-emu: {} blocks: expected 1..256", o_.blocks);
    if (o_.threads < 32 || o_.threads % 32 || o_.threads > 1024)
      fail("cuda-emu: {} threads per block: expected a multiple of 32 in [32, 1024]", o_.threads);
    info_.name = "cuda-emu";
    info_.sms = o_.blocks;
    info_.cc_major = 9;
    info_.cc_minor = 0;
    info_.smem_optin = 227 * 1024;
    info_.threads = o_.threads;
  }
  ~EmuRuntime() override {
    for (void* p : allocations_) std::free(p);
    if (handle_) ::dlclose(handle_);
  }

  const DeviceInfo& info() const override { return info_; }

  uint64_t alloc(size_t bytes) override {
    const size_t n = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, n);
    if (!p) fail("cuda-emu: out of memory allocating {} bytes", n);
    std::memset(p, 0, n);
    allocations_.push_back(p);
    return reinterpret_cast<uint64_t>(p);
  }
  void* host_alloc(size_t bytes, uint64_t* device_alias) override {
    const uint64_t p = alloc(bytes);
    if (device_alias) *device_alias = p;
    return reinterpret_cast<void*>(p);
  }
  void memset0(uint64_t dst, size_t bytes) override {
    std::memset(reinterpret_cast<void*>(dst), 0, bytes);
    for (int r = 0; r < 2; ++r) stamp_range(r, dst, bytes, 0, true);
  }
  void copy_to_device(uint64_t dst, const void* src, size_t bytes, bool) override {
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    for (int r = 0; r < 2; ++r) stamp_range(r, dst, bytes, 0xffffffffull, false);  // host-written inputs
  }
  void copy_on_device(uint64_t dst, uint64_t src, size_t bytes) override {
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    for (int r = 0; r < 2; ++r) stamp_range(r, dst, bytes, 0xffffffffull, false);  // an input, as a host copy's
  }
  void copy_to_host(void* dst, uint64_t src, size_t bytes, bool) override {
    std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  }

  // Whether `path` is a whole ELF64 object: its program and section header tables and every
  // segment's bytes lie inside the file. A cut one would be mapped by dlopen and fault (SIGBUS) on
  // the first page past its end (new-user trial 45: a damaged cache entry).
  static bool whole_elf(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    unsigned char h[64] = {};
    if (!f.read(reinterpret_cast<char*>(h), sizeof h)) return false;
    if (h[0] != 0x7f || h[1] != 'E' || h[2] != 'L' || h[3] != 'F' || h[4] != 2 /* 64-bit */ || h[5] != 1 /* little-endian */)
      return false;
    auto u16 = [](const unsigned char* p) { return uint64_t{p[0]} | uint64_t{p[1]} << 8; };
    auto u64 = [](const unsigned char* p) {
      uint64_t v = 0;
      for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
      return v;
    };
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) return false;
    const uint64_t phoff = u64(h + 32), shoff = u64(h + 40), phentsize = u16(h + 54), phnum = u16(h + 56),
                   shentsize = u16(h + 58), shnum = u16(h + 60);
    if (phentsize < 56 || phnum > 4096 || shnum > 65535 || phoff > size || phnum * phentsize > size - phoff ||
        shoff > size || shnum * shentsize > size - shoff)
      return false;
    for (uint64_t i = 0; i < phnum; ++i) {
      unsigned char ph[56];
      f.seekg(static_cast<std::streamoff>(phoff + i * phentsize));
      if (!f.read(reinterpret_cast<char*>(ph), sizeof ph)) return false;
      const uint64_t offset = u64(ph + 8), filesz = u64(ph + 32);
      if (offset > size || filesz > size - offset) return false;
    }
    return true;
  }

  ModuleInfo load(const CudaSource& src, const Program& program) override {
    ModuleInfo mi;
    const char* env_cxx = std::getenv("MK_EMU_CXX");
    const std::string cxx = !o_.cxx.empty() ? o_.cxx : env_cxx && *env_cxx ? env_cxx : "c++";
    std::string flags = "-std=c++20 -O2 -g0 -fPIC -shared -fno-strict-aliasing -w -pthread";
    if (built_with_asan()) flags += " -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer";
    const std::string text = std::string("#define MK_EMU_HEAD 1\n") + text::emu_host + "\n#undef MK_EMU_HEAD\n" + src.code +
                             "\n#define MK_EMU_TAIL 1\n" + text::emu_host + "\n";
    mi.what = cxx;
    const std::string version = compiler_version(cxx);
    const uint64_t key = Fnv1a64().field(cxx).field(version).field(flags).field(text).value();
    std::string dir = o_.cache_dir;
    if (dir.empty()) {
      const std::string base = default_cache_dir();
      dir = base.empty() ? std::filesystem::temp_directory_path().string() + "/megakernel-emu" : base + "/emu";
    }
    std::error_code ec;
    // Without the disk cache (MK_CUDA_CACHE=0), or when its folder cannot be made, the object is
    // built in a private temporary folder and removed once loaded.
    bool cache = env_flag("MK_CUDA_CACHE", true);
    if (cache) {
      std::filesystem::create_directories(dir, ec);
      if (ec) {
        std::fprintf(stderr, "note: cuda-emu: cannot create the cache folder %s (%s; it is under $XDG_CACHE_HOME, else ~/.cache): "
                             "building without the cache\n", dir.c_str(), ec.message().c_str());
        cache = false;
      }
    }
    std::string scratch;
    if (!cache) {
      std::string pattern = (std::filesystem::temp_directory_path(ec) / "megakernel-emu-XXXXXX").string();
      if (ec || !::mkdtemp(pattern.data()))
        fail("cuda-emu: cannot create a temporary folder for the compiled object ({}; set TMPDIR to a writable folder)",
             ec ? ec.message() : std::strerror(errno));
      dir = scratch = pattern;
    }
    struct RemoveScratch {
      const std::string& dir;
      ~RemoveScratch() {
        std::error_code e;
        if (!dir.empty()) std::filesystem::remove_all(dir, e);
      }
    } remove_scratch{scratch};
    const std::string so = fmt::format("{}/{:016x}.so", dir, key);
    // A cached object that is not whole (cut by a full disk or a crash outside this process) is
    // built again rather than loaded.
    if (std::filesystem::exists(so) && !whole_elf(so)) {
      std::fprintf(stderr, "note: cuda-emu: the cached object %s is damaged: building it again\n", so.c_str());
      std::filesystem::remove(so, ec);
    }
    if (!std::filesystem::exists(so)) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string tmp = fmt::format("{}/{:016x}.{}.tmp", dir, key, ::getpid());
      {
        std::ofstream f(tmp + ".cpp", std::ios::binary);
        f << text;
        if (!f) fail("cuda-emu: cannot write {}.cpp", tmp);
      }
      std::string out;
      const std::string cmd = fmt::format("{} {} -o {} {} -lboost_context", shell_quote(cxx), flags, shell_quote(tmp + ".so"),
                                          shell_quote(tmp + ".cpp"));
      const int st = run_command(cmd, &out);
      ++g_emu_compiles;
      if (st != 0) {
        std::filesystem::remove(tmp + ".so", ec);
        if (out.size() > 20000) out = out.substr(0, 20000) + "\n... (log truncated)";
        fail("cuda-emu: host compile of the generated source failed (exit {}; source kept at {}.cpp):\n{}", st, tmp, out);
      }
      std::filesystem::remove(tmp + ".cpp", ec);
      std::filesystem::rename(tmp + ".so", so, ec);
      if (ec) fail("cuda-emu: cannot move the compiled object to {}: {}", so, ec.message());
      mi.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    } else {
      mi.from_cache = true;
    }
    handle_ = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_)
      fail("cuda-emu: cannot load {}: {}{}", so, ::dlerror(),
           mi.from_cache ? " (a damaged cache entry: remove the file, or run with MK_CUDA_CACHE=0)" : "");
    run_ = reinterpret_cast<RunFn>(::dlsym(handle_, "mk_emu_run"));
    if (!run_) fail("cuda-emu: {} has no mk_emu_run", so);
    build_happens_before(program);
    return mi;
  }

  int max_resident_blocks(const std::string&, int, size_t) override { return 256; }

  void launch(const std::string& kernel, unsigned grid, unsigned threads, size_t smem_bytes, const MkParams& params, int first,
              bool cooperative) override {
    if (!run_) fail("cuda-emu: launch before load");
    if (threads != static_cast<unsigned>(o_.threads)) fail("cuda-emu: launch with {} threads, built for {}", threads, o_.threads);
    void* sym = ::dlsym(handle_, kernel.c_str());
    if (!sym) fail("cuda-emu: no kernel {}", kernel);
    EmuLaunch L{};
    if (first >= 0) L.perop = reinterpret_cast<void (*)(const MkParams, int)>(sym);
    else L.megakernel = reinterpret_cast<void (*)(const MkParams)>(sym);
    L.first = first;
    L.params = &params;
    L.grid = grid;
    L.threads = threads;
    L.smem_bytes = smem_bytes;
    L.stack_bytes = built_with_asan() ? 512 * 1024 : 128 * 1024;
    EmuHooks h{};
    h.race_check = race_ready_ && o_.race_check ? 1 : 0;
    h.epoch = params.epoch;
    h.n_instrs = n_instrs_;
    h.hb_words = hb_words_;
    h.hb = hb_.data();
    for (int r = 0; r < 2; ++r) {
      h.region_base[r] = reinterpret_cast<char*>(region_[r].base);
      h.region_elems[r] = region_[r].elems;
      h.writer[r] = region_[r].writer.data();
      h.reader[r] = region_[r].reader.data();
    }
    h.error = reinterpret_cast<void*>(params.error);
    h.abort_flag = reinterpret_cast<volatile unsigned*>(params.abort_flag);
    h.spin_yield = 16;
    L.hooks = &h;
    // Perop launches run their blocks one after another (they never wait on each other).
    if (!cooperative && grid > 1) {
      for (unsigned b = 0; b < grid; ++b) {
        MkParams one = params;
        EmuLaunch L1 = L;
        L1.grid = 1;
        L1.first = first + static_cast<int>(b);
        L1.params = &one;
        run_(&L1);
      }
      return;
    }
    run_(&L);
  }

  void begin_capture() override { fail("cuda-emu: graph capture is not emulated (use cuda-emu for the megakernel)"); }
  void end_capture() override { fail("cuda-emu: graph capture is not emulated"); }
  void replay() override { fail("cuda-emu: graph replay is not emulated"); }
  std::string synchronize() override { return ""; }

  void set_regions(uint64_t arena, size_t arena_bytes, uint64_t kv, size_t kv_bytes) override {
    region_[0].set(arena, arena_bytes);
    region_[1].set(kv, kv_bytes);
  }

  std::string describe_error(const MkError& e, const Program& p) const override {
    auto instr = [&](int i) -> std::string {
      if (i < 0 || i >= static_cast<int>(p.instrs.size())) return fmt::format("instruction {}", i);
      const Instr& in = p.instrs[static_cast<size_t>(i)];
      return fmt::format("instruction {} ({} {} tile {})", i, opcode_name(in.opcode), p.ops[static_cast<size_t>(in.op)].name, in.tile);
    };
    if (e.kind != 3 && e.kind != 4) return "";
    const int region = (e.block >> 30) & 1;
    const int block = e.block & ((1 << 30) - 1);
    const std::string where = element_name(p, region, e.value, e.instr);
    if (e.kind == 3) {
      const std::string writer = e.counter < 0 ? "nothing in this launch (never written)"
                                 : e.target != e.epoch ? fmt::format("{} in step {}", instr(e.counter), e.target)
                                                       : fmt::format("{} of this step, which its waits do not order before it", instr(e.counter));
      return fmt::format("race: {} read {}, last written by {} (block {}, step {})", instr(e.instr), where, writer, block, e.epoch);
    }
    return fmt::format("race: {} wrote {} while {} also touches it in this step, unordered by waits (block {}, step {})",
                       instr(e.instr), where, instr(e.counter), block, e.epoch);
  }

 private:
  struct Region {
    uint64_t base = 0;
    unsigned long long elems = 0;
    std::vector<unsigned long long> writer, reader;
    void set(uint64_t b, size_t bytes) {
      base = b;
      elems = bytes / 4;
      writer.assign(elems, 0);
      reader.assign(elems, 0);
    }
  };

  // Marks host writes (stamp ~0: always valid) or clears stamps, for the part of [dst, dst+bytes) in region r.
  void stamp_range(int r, uint64_t dst, size_t bytes, unsigned long long value, bool clear) {
    Region& R = region_[r];
    if (!R.base || R.writer.empty()) return;
    const uint64_t lo = std::max<uint64_t>(dst, R.base), hi = std::min<uint64_t>(dst + bytes, R.base + R.elems * 4);
    for (uint64_t a = lo; a + 4 <= hi; a += 4) {
      const size_t e = (a - R.base) / 4;
      R.writer[e] = clear ? 0 : value;
      if (clear) R.reader[e] = 0;
    }
  }

  // The buffer holding arena/KV element `elem`: among the buffers instruction `instr` touches first
  // (memplan gives dead buffers' memory to later ones, so an address can belong to several).
  std::string element_name(const Program& p, int region, unsigned elem, int instr) const {
    const uint64_t byte = static_cast<uint64_t>(elem) * 4;
    std::vector<size_t> order;
    if (instr >= 0 && instr < static_cast<int>(p.instrs.size()))
      for (const Access& a : instr_accesses(p, p.instrs[static_cast<size_t>(instr)])) order.push_back(static_cast<size_t>(a.buffer));
    for (size_t b = 0; b < p.buffers.size(); ++b) order.push_back(b);
    for (size_t b : order) {
      const Buffer& B = p.buffers[b];
      if ((B.kind == BufferKind::kv) != (region == 1) || B.offset < 0) continue;
      const uint64_t lo = static_cast<uint64_t>(B.offset), hi = lo + static_cast<uint64_t>(B.bytes());
      if (byte >= lo && byte < hi && B.cols > 0) {
        const uint64_t i = (byte - lo) / 4;
        return fmt::format("{} [{}, {}]", B.name, i / static_cast<uint64_t>(B.cols), i % static_cast<uint64_t>(B.cols));
      }
    }
    return fmt::format("{} element {}", region == 1 ? "KV storage" : "arena", elem);
  }

  void build_happens_before(const Program& p) {
    n_instrs_ = static_cast<unsigned>(p.instrs.size());
    race_ready_ = false;
    hb_.clear();
    if (p.instrs.size() > 40000) {
      std::fprintf(stderr, "cuda-emu: %zu instructions: race check off (it keeps an n x n relation)\n", p.instrs.size());
      return;
    }
    const size_t n = p.instrs.size(), nc = p.counters.size();
    hb_words_ = static_cast<unsigned>((n + 63) / 64);
    hb_.assign(n * hb_words_, 0);
    std::vector<std::vector<int>> signallers(nc);
    for (size_t i = 0; i < n; ++i) {
      const int s = p.instrs[i].signal;
      if (s >= 0 && static_cast<size_t>(s) < nc) signallers[static_cast<size_t>(s)].push_back(static_cast<int>(i));
    }
    // Kahn's order over instructions: an instruction is ready when every counter it fully waits on
    // has all its signallers done; a counter's set = union over signallers of (hb[s] + s).
    std::vector<std::vector<unsigned long long>> cset(nc);
    std::vector<int> pending_signallers(nc);
    for (size_t c = 0; c < nc; ++c) pending_signallers[c] = static_cast<int>(signallers[c].size());
    std::vector<std::vector<int>> waiters(nc);
    std::vector<int> pending(n, 0);
    std::vector<int> ready;
    for (size_t i = 0; i < n; ++i) {
      for (const Wait& w : p.instrs[i].waits) {
        if (w.counter < 0 || static_cast<size_t>(w.counter) >= nc) continue;
        if (w.count < signallers[static_cast<size_t>(w.counter)].size() || w.count == 0) continue;  // orders nothing
        waiters[static_cast<size_t>(w.counter)].push_back(static_cast<int>(i));
        ++pending[i];
      }
      if (!pending[i]) ready.push_back(static_cast<int>(i));
    }
    std::vector<int> counters_of_waits;
    while (!ready.empty()) {
      const int i = ready.back();
      ready.pop_back();
      unsigned long long* row = &hb_[static_cast<size_t>(i) * hb_words_];
      for (const Wait& w : p.instrs[static_cast<size_t>(i)].waits) {
        if (w.counter < 0 || static_cast<size_t>(w.counter) >= nc) continue;
        const auto& cs = cset[static_cast<size_t>(w.counter)];
        if (w.count < signallers[static_cast<size_t>(w.counter)].size() || cs.empty()) continue;
        for (unsigned k = 0; k < hb_words_; ++k) row[k] |= cs[k];
      }
      const int s = p.instrs[static_cast<size_t>(i)].signal;
      if (s < 0 || static_cast<size_t>(s) >= nc) continue;
      auto& cs = cset[static_cast<size_t>(s)];
      if (cs.empty()) cs.assign(hb_words_, 0);
      for (unsigned k = 0; k < hb_words_; ++k) cs[k] |= row[k];
      cs[static_cast<size_t>(i) / 64] |= 1ull << (static_cast<size_t>(i) % 64);
      if (--pending_signallers[static_cast<size_t>(s)] == 0)
        for (int r : waiters[static_cast<size_t>(s)])
          if (--pending[static_cast<size_t>(r)] == 0) ready.push_back(r);
    }
    race_ready_ = true;
  }

  std::string compiler_version(const std::string& cxx) {
    static std::mutex mu;
    static std::map<std::string, std::string> known;
    std::lock_guard<std::mutex> lock(mu);
    auto it = known.find(cxx);
    if (it != known.end()) return it->second;
    std::string out;
    if (run_command(shell_quote(cxx) + " --version", &out) != 0)
      fail("cuda-emu needs a host C++ compiler: '{} --version' failed: {}", cxx, out.substr(0, 500));
    return known[cxx] = out;
  }

  EmuOptions o_;
  DeviceInfo info_;
  std::vector<void*> allocations_;
  void* handle_ = nullptr;
  RunFn run_ = nullptr;
  Region region_[2];
  std::vector<unsigned long long> hb_;
  unsigned hb_words_ = 0, n_instrs_ = 0;
  bool race_ready_ = false;
};

}  // namespace

EmuOptions emu_options_from_env(int blocks_default) {
  EmuOptions o;
  o.blocks = static_cast<int>(env_int("MK_EMU_BLOCKS", blocks_default > 0 ? blocks_default : 4, 1, 1024));  // -t overrides both
  o.threads = static_cast<int>(env_int("MK_EMU_THREADS", 128, 32, 1024));
  o.race_check = env_flag("MK_EMU_RACE_CHECK", true);
  return o;
}

std::unique_ptr<DeviceRuntime> make_emu_runtime(const EmuOptions& options) { return std::make_unique<EmuRuntime>(options); }

uint64_t emu_compile_count() { return g_emu_compiles.load(); }

}  // namespace mk::cuda
