// CUDA without a GPU: NVRTC compiles to sm_90, errors carry the NVRTC log, the on-disk cache hits,
// and the run-time driver loader reports a missing driver instead of crashing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "backend/cuda/driver.h"
#include "backend/cuda/nvrtc.h"
#include "support/error.h"
#include "support/hash.h"

using namespace mk;

namespace {

const char* kSaxpy = R"(
extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

// A fresh cache folder per test, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("mk_cuda_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

#define MK_REQUIRE_NVRTC() \
  if (!MK_HAVE_NVRTC_VALUE) GTEST_SKIP() << "built without the CUDA toolkit (NVRTC)"
#if MK_HAVE_NVRTC
constexpr bool MK_HAVE_NVRTC_VALUE = true;
#else
constexpr bool MK_HAVE_NVRTC_VALUE = false;
#endif

}  // namespace

TEST(CudaBuildHash, Fnv1a64KnownValues) {
  // Published FNV-1a 64 test vectors.
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
  EXPECT_NE(Fnv1a64().field("ab").field("c").value(), Fnv1a64().field("a").field("bc").value());
}

TEST(CudaBuildNvrtc, CompilesSmallKernelToSm90Cubin) {
  MK_REQUIRE_NVRTC();
  TempDir dir;
  cuda::NvrtcOptions o;
  o.arch = "sm_90";
  o.cache_dir = dir.path.string();
  cuda::NvrtcResult r = cuda::compile_to_cubin(kSaxpy, o);
  ASSERT_GT(r.cubin.size(), 64u);
  EXPECT_EQ(std::string(r.cubin.data() + 1, 3), "ELF");  // a CUBIN is an ELF image
  EXPECT_FALSE(r.from_cache);
  EXPECT_FALSE(cuda::nvrtc_version().empty());
}

TEST(CudaBuildNvrtc, CompilesSmallKernelToPtx) {
  MK_REQUIRE_NVRTC();
  cuda::NvrtcOptions o;
  o.arch = "sm_90";  // the PTX is for its virtual architecture, compute_90
  cuda::NvrtcResult r = cuda::compile_to_ptx(kSaxpy, o);
  EXPECT_TRUE(r.cubin.empty());
  EXPECT_NE(r.ptx.find(".target sm_90"), std::string::npos) << r.ptx.substr(0, 400);
  EXPECT_NE(r.ptx.find(".entry"), std::string::npos);
  EXPECT_EQ(r.ptx.find('\0'), std::string::npos);
  EXPECT_THROW(cuda::compile_to_ptx("__global__ void k() { undefined_name(); }", o), Error);
}

TEST(CudaBuildNvrtc, CompileErrorCarriesTheLog) {
  MK_REQUIRE_NVRTC();
  TempDir dir;
  cuda::NvrtcOptions o;
  o.name = "broken.cu";
  o.cache_dir = dir.path.string();
  std::string src = "extern \"C\" __global__ void k(float* y) {\n  y[0] = undeclared_variable_xyz;\n}\n";
  try {
    cuda::compile_to_cubin(src, o);
    FAIL() << "expected a compile error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("broken.cu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sm_90"), std::string::npos) << msg;
    // NVRTC's own log line: file(line): error: identifier ... is undefined
    EXPECT_NE(msg.find("broken.cu(2): error"), std::string::npos) << msg;
    EXPECT_NE(msg.find("undeclared_variable_xyz"), std::string::npos) << msg;
  }
  // Nothing was cached for the failed source.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

TEST(CudaBuildNvrtc, SecondCompileHitsTheDiskCache) {
  MK_REQUIRE_NVRTC();
  TempDir dir;
  cuda::NvrtcOptions o;
  o.cache_dir = dir.path.string();
  uint64_t before = cuda::nvrtc_compile_count();
  cuda::NvrtcResult a = cuda::compile_to_cubin(kSaxpy, o);
  EXPECT_EQ(cuda::nvrtc_compile_count(), before + 1);
  ASSERT_FALSE(a.cache_path.empty());
  EXPECT_TRUE(std::filesystem::exists(a.cache_path));
  cuda::NvrtcResult b = cuda::compile_to_cubin(kSaxpy, o);
  EXPECT_EQ(cuda::nvrtc_compile_count(), before + 1) << "the second compile ran NVRTC again";
  EXPECT_TRUE(b.from_cache);
  EXPECT_EQ(a.cubin, b.cubin);
  EXPECT_EQ(a.key, b.key);

  // Another architecture or flag is another key, hence another compile.
  cuda::NvrtcOptions o2 = o;
  o2.flags.push_back("-DMK_TEST_FLAG=1");
  EXPECT_NE(cuda::cubin_cache_key(kSaxpy, o2), a.key);
  cuda::NvrtcResult c = cuda::compile_to_cubin(kSaxpy, o2);
  EXPECT_FALSE(c.from_cache);
  EXPECT_EQ(cuda::nvrtc_compile_count(), before + 2);
}

TEST(CudaBuildNvrtc, DamagedCacheFileIsRebuilt) {
  MK_REQUIRE_NVRTC();
  TempDir dir;
  cuda::NvrtcOptions o;
  o.cache_dir = dir.path.string();
  cuda::NvrtcResult a = cuda::compile_to_cubin(kSaxpy, o);
  ASSERT_FALSE(a.cache_path.empty());
  std::filesystem::resize_file(a.cache_path, 40);  // truncated, e.g. by a full disk
  uint64_t before = cuda::nvrtc_compile_count();
  cuda::NvrtcResult b = cuda::compile_to_cubin(kSaxpy, o);
  EXPECT_FALSE(b.from_cache);
  EXPECT_EQ(cuda::nvrtc_compile_count(), before + 1);
  EXPECT_EQ(a.cubin, b.cubin);
  cuda::NvrtcResult c = cuda::compile_to_cubin(kSaxpy, o);
  EXPECT_TRUE(c.from_cache);
}

TEST(CudaBuildNvrtc, CacheDirectoryFollowsXdg) {
  const char* old = std::getenv("XDG_CACHE_HOME");
  std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", "/tmp/mk_xdg_probe", 1);
  EXPECT_EQ(cuda::default_cache_dir(), "/tmp/mk_xdg_probe/megakernel");
  if (old) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(cuda::arch_for_compute_capability(9, 0), "sm_90");
}

TEST(CudaBuildDriver, UnavailableWithoutGpuReportsReason) {
  // This machine has no GPU: the loader must say why and not crash. On a machine with a working
  // driver and device the test checks the opposite.
  std::string reason;
  bool ok = cuda::cuda_available(&reason);
  if (ok) {
    EXPECT_TRUE(reason.empty());
    GTEST_SKIP() << "a CUDA device is present";
  }
  EXPECT_FALSE(reason.empty());
#if MK_HAVE_NVRTC
  try {
    (void)cuda::driver();
    FAIL() << "driver() must throw without a driver";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA driver: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
#endif
}

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"

TEST(CudaBuildDriver, BackendsFailClearlyWithoutDriver) {
  std::string reason;
  if (cuda::cuda_available(&reason)) GTEST_SKIP() << "a CUDA device is present";
  ModelFile m = load_model(std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf");
  BuildOptions bo;
  bo.n_ctx = 64;
  Graph g = build_graph(m, bo);
  for (const char* name : {"cuda", "cuda-perop", "cuda-graph"}) {
    try {
      make_backend(name, g, m, BackendOptions{});
      FAIL() << name << ": expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("no CUDA driver: ", 0), 0u) << e.what();
    }
  }
}
