#include "model/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "support/error.h"

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

  const char* header_begin = reinterpret_cast<const char*>(file->data() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid safetensors JSON header: {}", src, e.what());
  }
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
        if (!v.is_string()) fail("{}: __metadata__ value of {} is not a string", src, k);
        info.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) fail("{}: tensor {}: header entry is not an object", src, name);
    if (!entry.contains("dtype") || !entry["dtype"].is_string())
      fail("{}: tensor {}: missing or non-string dtype", src, name);
    const std::string dtype_str = entry["dtype"].get<std::string>();
    auto dtype = parse_dtype(dtype_str);
    if (!dtype) fail("{}: tensor {}: unsupported dtype {} (supported: F32, F16, BF16)", src, name, dtype_str);

    if (!entry.contains("shape") || !entry["shape"].is_array()) fail("{}: tensor {}: missing shape", src, name);
    WeightTensor t;
    t.name = name;
    t.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) fail("{}: tensor {}: shape entries must be non-negative integers", src, name);
      uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, v, &numel))
        fail("{}: tensor {}: shape {} is too large", src, name, entry["shape"].dump());
      t.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_block_bytes(*dtype)), &expected_bytes))
      fail("{}: tensor {}: shape {} is too large", src, name, entry["shape"].dump());

    const auto& off = entry.contains("data_offsets") ? entry["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("{}: tensor {}: data_offsets must be two non-negative integers", src, name);
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end) fail("{}: tensor {}: data_offsets [{}, {}) has begin after end", src, name, begin, end);
    if (end > data_size)
      fail("{}: tensor {}: data_offsets [{}, {}) run past the end of the data section ({} bytes)", src, name, begin,
           end, data_size);
    if (end - begin != expected_bytes)
      fail("{}: tensor {}: {} {} needs {} bytes, data_offsets [{}, {}) hold {}", src, name, dtype_str,
           shape_str(t.shape), expected_bytes, begin, end, end - begin);

    t.data = file->data() + data_start + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    t.file_offset = data_start + begin;
    if (begin != end) extents.push_back({begin, end, name});
    tensors.push_back(std::move(t));
  }

  // The ranges must not overlap (empty tensors occupy nothing and may sit anywhere).
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  for (size_t i = 1; i < extents.size(); ++i)
    if (extents[i].begin < extents[i - 1].end)
      fail("{}: tensors {} [{}, {}) and {} [{}, {}) overlap", src, extents[i - 1].name, extents[i - 1].begin,
           extents[i - 1].end, extents[i].name, extents[i].begin, extents[i].end);

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
