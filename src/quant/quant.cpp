#include "quant/quant.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "model/model_file.h"
#include "quant/quant_impl.h"
#include "support/error.h"

namespace mk::quant {

extern const QuantType kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_NL, kIQ4_XS;

namespace {
const std::array<const QuantType*, 12> kTypes = {&kQ4_0, &kQ4_1, &kQ5_0, &kQ5_1, &kQ8_0,   &kQ2_K,
                                                 &kQ3_K, &kQ4_K, &kQ5_K, &kQ6_K, &kIQ4_NL, &kIQ4_XS};
}  // namespace

namespace detail {
Isa runtime_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2")) return Isa::avx2;
  return Isa::generic;
}
}  // namespace detail

DotIsa dot_isa() { return detail::runtime_isa(); }

namespace {
// AMX-TILE and AMX-INT8 (CPUID.(EAX=7, ECX=0):EDX[24], [25]) and the kernel's permission to use the
// tile data state (XFEATURE_XTILEDATA = 18), which Linux grants per process on request.
bool amx_permitted() {
#if defined(__x86_64__) && defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

GemmIsa runtime_gemm_isa() {
  __builtin_cpu_init();
  if (detail::runtime_isa() == DotIsa::generic) return GemmIsa::generic;
  if (detail::runtime_isa() == DotIsa::avx512 && __builtin_cpu_supports("avx512vnni"))
    return amx_permitted() ? GemmIsa::amx : GemmIsa::avx512vnni;
  if (__builtin_cpu_supports("avxvnni")) return GemmIsa::avxvnni;
  return GemmIsa::avx2;
}
}  // namespace

bool gemm_isa_available(GemmIsa isa) {
  static const GemmIsa have = runtime_gemm_isa();
  if (isa == GemmIsa::avxvnni) return __builtin_cpu_supports("avxvnni");
  return static_cast<int>(isa) <= static_cast<int>(have);
}

bool gemm_packed_available() {
  static const bool off = [] {
    const char* e = std::getenv("MK_GEMM_PACK");
    return e != nullptr && std::string_view(e) == "0";
  }();
  return gemm_isa() != GemmIsa::generic && !off;
}

GemmIsa gemm_isa() {
  static const GemmIsa isa = [] {
    GemmIsa best = runtime_gemm_isa();
    if (const char* e = std::getenv("MK_GEMM_ISA")) {
      bool found = false;
      for (GemmIsa i : {GemmIsa::generic, GemmIsa::avx2, GemmIsa::avxvnni, GemmIsa::avx512vnni, GemmIsa::amx})
        if (gemm_isa_name(i) == e && gemm_isa_available(i)) best = i, found = true;
      if (!found)  // a benchmark's A/B would otherwise measure the default without saying so
        std::fprintf(stderr,
                     "warning: MK_GEMM_ISA=%s is not one of generic|avx2|avxvnni|avx512vnni|amx that this CPU "
                     "runs; using %s\n",
                     e, std::string(gemm_isa_name(best)).c_str());
    }
    return best;
  }();
  return isa;
}

std::string_view gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::amx: return "amx";
    case GemmIsa::avx512vnni: return "avx512vnni";
    case GemmIsa::avxvnni: return "avxvnni";
    case GemmIsa::avx2: return "avx2";
    case GemmIsa::generic: return "generic";
  }
  return "generic";
}

bool dot_isa_available(DotIsa isa) {
  const DotIsa have = detail::runtime_isa();
  return isa == DotIsa::generic || static_cast<int>(isa) <= static_cast<int>(have);
}

std::string_view dot_isa_name(DotIsa isa) {
  switch (isa) {
    case DotIsa::avx512: return "avx512";
    case DotIsa::avx2: return "avx2";
    case DotIsa::generic: return "generic";
  }
  return "generic";
}

const QuantType* quant_type(DType t) {
  for (const QuantType* q : kTypes)
    if (q->dtype == t) return q;
  return nullptr;
}

const QuantType* quant_type_from_ggml(uint32_t id) {
  for (const QuantType* q : kTypes)
    if (q->ggml_type == id) return q;
  return nullptr;
}

std::span<const QuantType* const> quant_types() { return kTypes; }

ModelFile quantize_model(const ModelFile& m, const std::function<std::optional<DType>(const WeightTensor&)>& type_of) {
  ModelFile out;
  out.path = m.path;
  out.format = m.format;
  out.metadata = m.metadata;
  out.files = m.files;
  out.owned = m.owned;
  for (const WeightTensor& src : m.tensors()) {
    WeightTensor w = src;
    const bool plain = src.dtype == DType::F32 || src.dtype == DType::F16 || src.dtype == DType::BF16;
    const std::optional<DType> to = plain ? type_of(src) : std::nullopt;
    const QuantType* q = to ? quant_type(*to) : nullptr;
    if (to && !q) fail("quantize: {}: {} is not a quantized type", src.name, dtype_name(*to));
    if (q && !src.shape.empty() && src.shape.back() % q->block_size == 0) {
      std::vector<float> f(static_cast<size_t>(src.numel()));
      to_f32(src.dtype, src.data, f.data(), src.numel());
      auto buf = std::make_shared<std::vector<uint8_t>>(dtype_bytes(q->dtype, src.numel()));
      const int64_t K = src.shape.back(), rows = src.numel() / K;
      const size_t row_bytes = dtype_bytes(q->dtype, K);
      for (int64_t r = 0; r < rows; ++r)
        q->quantize_row(f.data() + r * K, buf->data() + static_cast<size_t>(r) * row_bytes, K);
      w.dtype = q->dtype;
      w.data = buf->data();
      w.nbytes = buf->size();
      out.owned.push_back(std::move(buf));
    }
    out.add_tensor(std::move(w));
  }
  return out;
}

ModelFile quantize_model(const ModelFile& m, DType t, std::optional<DType> fallback) {
  return quantize_model(m, [&](const WeightTensor& w) -> std::optional<DType> {
    if (w.shape.size() != 2) return std::nullopt;
    if (w.shape[1] % dtype_block_size(t) == 0) return t;
    return fallback;
  });
}

}  // namespace mk::quant
