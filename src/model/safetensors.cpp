#include "model/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "support/error.h"
#include "support/json.h"

namespace mk {

namespace {

// Safetensors dtype names -> our dtypes. Everything else is rejected by name.
std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  return std::nullopt;
}

struct Extent {
  uint64_t begin, end;
  std::string name;
};

}  // namespace

SafetensorsInfo add_safetensors(ModelFile& model, std::shared_ptr<MappedFile> file) {
  const std::string& src = file->path();
  const uint64_t file_size = file->size();
  if (file_size < 8) fail("{}: too small for a safetensors file ({} bytes)", src, file_size);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->data()[i];
  if (header_len > file_size - 8)
    fail("{}: safetensors header length {} runs past the end of the file ({} bytes)", src, header_len, file_size);

  const std::string_view header_text(reinterpret_cast<const char*>(file->data() + 8), header_len);
  // The spec: the header is UTF-8 JSON starting with '{', optionally padded at the end with spaces
  // (JSON whitespace is accepted too). A NUL or other byte after the JSON is damage, not padding.
  if (header_text.empty() || header_text[0] != '{')
    fail("{}: safetensors header does not start with '{{'", src);
  if (size_t nul = header_text.find('\0'); nul != std::string_view::npos)
    fail("{}: safetensors header holds a NUL byte at offset {} (only spaces may pad the header)", src, 8 + nul);
  const nlohmann::json header = parse_json<nlohmann::json>(header_text, src + ": safetensors header", "tensor");
  if (!header.is_object()) fail("{}: safetensors header is not a JSON object", src);

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  SafetensorsInfo info;
  std::vector<WeightTensor> tensors;
  std::vector<Extent> extents;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: __metadata__ is not an object", src);
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail("{}: __metadata__ value of {} is not a string", src, clip(k));
        info.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) fail("{}: tensor {}: header entry is not an object", src, clip(name, 200));
    if (!entry.contains("dtype") || !entry["dtype"].is_string())
      fail("{}: tensor {}: missing or non-string dtype", src, clip(name, 200));
    const std::string dtype_str = entry["dtype"].get<std::string>();
    auto dtype = parse_dtype(dtype_str);
    if (!dtype) fail("{}: tensor {}: unsupported dtype {} (supported: F32, F16, BF16)", src, clip(name, 200), clip(dtype_str));

    if (!entry.contains("shape") || !entry["shape"].is_array()) fail("{}: tensor {}: missing shape", src, clip(name, 200));
    WeightTensor t;
    t.name = name;
    t.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) fail("{}: tensor {}: shape entries must be non-negative integers", src, clip(name, 200));
      uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, v, &numel))
        fail("{}: tensor {}: shape {} is too large", src, clip(name, 200), clip_json(entry["shape"]));
      t.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_block_bytes(*dtype)), &expected_bytes))
      fail("{}: tensor {}: shape {} is too large", src, clip(name, 200), clip_json(entry["shape"]));

    const auto& off = entry.contains("data_offsets") ? entry["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("{}: tensor {}: data_offsets must be two non-negative integers", src, clip(name, 200));
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end) fail("{}: tensor {}: data_offsets [{}, {}) has begin after end", src, clip(name, 200), begin, end);
    if (end > data_size)
      fail("{}: tensor {}: data_offsets [{}, {}) run past the end of the data section ({} bytes)", src, clip(name, 200), begin,
           end, data_size);
    if (end - begin != expected_bytes)
      fail("{}: tensor {}: {} {} needs {} bytes, data_offsets [{}, {}) hold {}", src, clip(name, 200), dtype_str,
           shape_str(t.shape), expected_bytes, begin, end, end - begin);

    t.data = file->data() + data_start + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    t.file_offset = data_start + begin;
    if (begin != end) extents.push_back({begin, end, clip(name, 200)});
    tensors.push_back(std::move(t));
  }

  // The ranges must tile the data section exactly, as the reference implementation requires: no
  // byte covered twice (aliased weights) and none covered by no tensor (a hole hides a lost or
  // misplaced tensor). Empty tensors occupy nothing and may sit anywhere.
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t covered = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    if (extents[i].begin < covered)
      fail("{}: tensors {} [{}, {}) and {} [{}, {}) overlap", src, clip(extents[i - 1].name, 200), extents[i - 1].begin,
           extents[i - 1].end, clip(extents[i].name, 200), extents[i].begin, extents[i].end);
    if (extents[i].begin > covered)
      fail("{}: data bytes [{}, {}) before tensor {} belong to no tensor", src, covered, extents[i].begin,
           clip(extents[i].name, 200));
    covered = extents[i].end;
  }
  if (covered != data_size)
    fail("{}: data bytes [{}, {}) at the end of the data section belong to no tensor{}", src, covered, data_size,
         extents.empty() ? "" : " (after " + clip(extents.back().name, 200) + ")");

  // Deterministic order for `info` and tests: by position in the file.
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const WeightTensor& a, const WeightTensor& b) { return a.file_offset < b.file_offset; });
  info.n_tensors = tensors.size();
  for (auto& t : tensors) model.add_tensor(std::move(t));
  model.files.push_back(std::move(file));
  return info;
}

ModelFile load_safetensors(const std::string& path) {
  ModelFile model;
  model.path = path;
  model.format = "safetensors";
  add_safetensors(model, MappedFile::open(path));
  return model;
}

}  // namespace mk
