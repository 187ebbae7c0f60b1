#include "model/model_file.h"

#include <cmath>
#include <filesystem>

#include "support/error.h"
#include "support/printable.h"
#include "support/json.h"  // clip

namespace mk {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void ModelFile::add_tensor(WeightTensor t) {
  if (index_.count(t.name)) fail("{}: duplicate tensor name {}", path, printable(t.name, 200));
  index_[t.name] = tensors_.size();
  tensors_.push_back(std::move(t));
}

const WeightTensor* ModelFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const WeightTensor& ModelFile::get(const std::string& name) const {
  const WeightTensor* t = find(name);
  if (!t) fail("{}: missing tensor {}", path, name);
  return *t;
}

void fail_tensor_shape(const std::string& path, const WeightTensor& t, const std::vector<int64_t>& expected) {
  const bool transposed = t.shape.size() == 2 && expected.size() == 2 && t.shape[0] == expected[1] && t.shape[1] == expected[0];
  fail("{}: tensor {} has shape {}, expected {}{}", path, t.name, shape_str(t.shape), shape_str(expected),
       transposed ? " (transposed?)" : "");
}

const WeightTensor& ModelFile::get(const std::string& name, const std::vector<int64_t>& expected) const {
  const WeightTensor& t = get(name);
  if (t.shape != expected) fail_tensor_shape(path, t, expected);
  return t;
}

int64_t ModelFile::get_int(const std::string& key) const {
  if (!metadata.contains(key)) fail("{}: missing metadata key {}", path, key);
  const auto& v = metadata.at(key);
  if (!v.is_number_integer()) fail("{}: metadata key {} is not an integer", path, key);
  // A GGUF u64 above INT64_MAX must not turn negative (or a huge count small) on the way.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail("{}: metadata key {} = {} is out of range", path, key, v.get<uint64_t>());
  return v.get<int64_t>();
}

int64_t ModelFile::get_int(const std::string& key, int64_t def) const {
  return metadata.contains(key) ? get_int(key) : def;
}

double ModelFile::get_float(const std::string& key, double def) const {
  if (!metadata.contains(key)) return def;
  const auto& v = metadata.at(key);
  if (!v.is_number()) fail("{}: metadata key {} is not a number", path, key);
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail("{}: metadata key {} = {} is not a finite number", path, key, d);
  return d;
}

std::string ModelFile::get_str(const std::string& key) const {
  if (!metadata.contains(key)) fail("{}: missing metadata key {}", path, key);
  const auto& v = metadata.at(key);
  if (!v.is_string()) fail("{}: metadata key {} is not a string", path, key);
  return v.get<std::string>();
}

WeightTensor row_view(const WeightTensor& t, int64_t row0, int64_t n_rows, std::string name) {
  const int64_t row_elems = t.shape.size() == 2 ? t.shape[1] : 1;
  const size_t row_bytes = dtype_bytes(t.dtype, row_elems);
  WeightTensor v;
  v.name = std::move(name);
  v.dtype = t.dtype;
  v.shape = t.shape.size() == 2 ? std::vector<int64_t>{n_rows, row_elems} : std::vector<int64_t>{n_rows};
  v.data = t.data + static_cast<size_t>(row0) * row_bytes;
  v.nbytes = static_cast<size_t>(n_rows) * row_bytes;
  v.file_offset = t.file_offset ? t.file_offset + static_cast<size_t>(row0) * row_bytes : 0;
  v.derived = true;
  return v;
}

}  // namespace mk
