// Writes a ModelFile as a GGUF v3 file (ggml docs/gguf.md), for tests that need real files of types
// no fixture has (quantized models made in memory with quant::quantize_model). Metadata: JSON
// unsigned integers become uint32 (uint64 when larger), signed ones int32/int64, numbers float32,
// strings, bools and flat arrays of those. Tensor data is copied as it is, at 32-byte alignment.
#pragma once
#include <fstream>
#include <string>

#include "model/model_file.h"
#include "quant/quant.h"
#include "support/error.h"

namespace mk::test {

namespace gguf_write_detail {
inline void put(std::string& s, const void* p, size_t n) { s.append(static_cast<const char*>(p), n); }
template <class T>
void put(std::string& s, T v) {
  put(s, &v, sizeof v);
}
inline void put_str(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}
// GGUF value type of a JSON scalar.
inline uint32_t value_type(const nlohmann::ordered_json& v) {
  if (v.is_boolean()) return 7;
  if (v.is_string()) return 8;
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= UINT32_MAX ? 4 : 10;
  if (v.is_number_integer()) return v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX ? 5 : 11;
  if (v.is_number_float()) return 6;
  fail("gguf_write: unsupported metadata value {}", v.dump());
}
inline void put_scalar(std::string& s, uint32_t t, const nlohmann::ordered_json& v) {
  switch (t) {
    case 4: put<uint32_t>(s, v.get<uint32_t>()); break;
    case 5: put<int32_t>(s, v.get<int32_t>()); break;
    case 6: put<float>(s, v.get<float>()); break;
    case 7: put<uint8_t>(s, v.get<bool>() ? 1 : 0); break;
    case 8: put_str(s, v.get<std::string>()); break;
    case 10: put<uint64_t>(s, v.get<uint64_t>()); break;
    case 11: put<int64_t>(s, v.get<int64_t>()); break;
  }
}
inline uint32_t ggml_id(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::BF16: return 30;
    default: break;
  }
  const quant::QuantType* q = quant::quant_type(t);
  if (!q) fail("gguf_write: no ggml type for {}", dtype_name(t));
  return q->ggml_type;
}
}  // namespace gguf_write_detail

inline std::string gguf_bytes(const ModelFile& m) {
  using namespace gguf_write_detail;
  std::string kv, info, data;
  for (auto it = m.metadata.begin(); it != m.metadata.end(); ++it) {
    const auto& v = it.value();
    put_str(kv, it.key());
    if (v.is_array()) {
      uint32_t et = 4;  // an empty array: uint32 elements
      bool all_int = true;
      for (const auto& e : v) all_int = all_int && e.is_number_integer();
      if (!v.empty()) et = all_int ? 5 : value_type(v[0]);  // integer arrays as int32 (token types)
      if (!v.empty() && all_int && v[0].is_number_unsigned() && value_type(v[0]) == 4) et = 4;
      put<uint32_t>(kv, 9);
      put<uint32_t>(kv, et);
      put<uint64_t>(kv, v.size());
      for (const auto& e : v) put_scalar(kv, et, e);
    } else {
      const uint32_t t = value_type(v);
      put<uint32_t>(kv, t);
      put_scalar(kv, t, v);
    }
  }
  for (const WeightTensor& t : m.tensors()) {
    while (data.size() % 32) data.push_back('\0');
    put_str(info, t.name);
    put<uint32_t>(info, static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) put<uint64_t>(info, static_cast<uint64_t>(t.shape[d]));  // innermost first
    put<uint32_t>(info, ggml_id(t.dtype));
    put<uint64_t>(info, data.size());
    put(data, t.data, t.nbytes);
  }
  std::string s = "GGUF";
  put<uint32_t>(s, 3);
  put<uint64_t>(s, m.tensors().size());
  put<uint64_t>(s, m.metadata.size());
  s += kv + info;
  while (s.size() % 32) s.push_back('\0');
  return s + data;
}

inline void write_gguf(const ModelFile& m, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  const std::string b = gguf_bytes(m);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
  if (!f) fail("gguf_write: cannot write {}", path);
}

}  // namespace mk::test
