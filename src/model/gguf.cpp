// GGUF loader (format: ggml docs/gguf.md, versions 2 and 3; little-endian only).
//
// Layout: magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv_count metadata pairs
// (string key, u32 value type, value), tensor_count tensor infos (string name, u32 n_dims,
// u64 ne[n_dims] innermost first, u32 ggml type, u64 offset relative to the data section), padding
// to `general.alignment`, then the data section. Strings are u64 length + bytes (no terminator).
//
// Every count, length and offset is checked against the bytes actually present before it is used
// or allocated for, so a damaged file gives an mk::Error naming the file, the field and the
// offset, never a crash or an oversized allocation.
#include <algorithm>
#include <array>
#include <optional>

#include "model/model_file.h"
#include "quant/quant.h"
#include "support/byte_reader.h"
#include "support/error.h"
#include "support/printable.h"
#include "support/json.h"

namespace mk {
namespace {

// Metadata value types (gguf.md, "gguf_metadata_value_type").
enum class ValueType : uint32_t {
  UInt8 = 0, Int8 = 1, UInt16 = 2, Int16 = 3, UInt32 = 4, Int32 = 5, Float32 = 6, Bool = 7,
  String = 8, Array = 9, UInt64 = 10, Int64 = 11, Float64 = 12,
};
constexpr uint32_t kValueTypeCount = 13;

const char* value_type_name(uint32_t t) {
  static constexpr std::array<const char*, kValueTypeCount> names = {
      "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
      "bool", "string", "array", "uint64", "int64", "float64"};
  return t < names.size() ? names[t] : "unknown";
}

// Smallest encoding of one value of type t: bounds how many elements an array can claim.
size_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::UInt8: case ValueType::Int8: case ValueType::Bool: return 1;
    case ValueType::UInt16: case ValueType::Int16: return 2;
    case ValueType::UInt32: case ValueType::Int32: case ValueType::Float32: return 4;
    case ValueType::UInt64: case ValueType::Int64: case ValueType::Float64: return 8;
    case ValueType::String: return 8;   // u64 length
    case ValueType::Array: return 12;   // u32 type + u64 count
  }
  return 1;
}

// ggml tensor types by id (ggml.h "enum ggml_type"); gaps are ids that ggml has retired.
std::string ggml_type_str(uint32_t t) {
  static constexpr std::array<const char*, 40> names = {
      "f32", "f16", "q4_0", "q4_1", "q4_2 (removed)", "q4_3 (removed)", "q5_0", "q5_1", "q8_0", "q8_1",
      "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s",
      "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m",
      "bf16", "q4_0_4_4 (removed)", "q4_0_4_8 (removed)", "q4_0_8_8 (removed)", "tq1_0", "tq2_0",
      "iq4_nl_4_4 (removed)", "iq4_nl_4_8 (removed)", "iq4_nl_8_8 (removed)", "mxfp4"};
  if (t < names.size()) return fmt::format("{} ({})", names[t], t);
  return fmt::format("unknown ggml type ({})", t);
}

std::optional<DType> dtype_from_ggml(uint32_t t) {
  switch (t) {
    case 0: return DType::F32;
    case 1: return DType::F16;
    case 30: return DType::BF16;
    default: break;
  }
  if (const quant::QuantType* q = quant::quant_type_from_ggml(t)) return q->dtype;  // q4_0 ... q6_K
  return std::nullopt;
}

// "f32, f16, bf16, q4_0, ...": the tensor types this loader reads, for error messages.
std::string supported_types() {
  std::string s = "f32, f16, bf16";
  for (const quant::QuantType* q : quant::quant_types()) s += fmt::format(", {}", q->name);
  return s;
}

constexpr uint32_t kMaxDims = 4;
constexpr size_t kMaxNameBytes = 64;     // GGML_MAX_NAME: tensor names are shorter
constexpr size_t kMaxKeyBytes = 65535;   // gguf.md: keys are at most 2^16 - 1 bytes
constexpr int kMaxArrayDepth = 16;
constexpr uint64_t kMaxElements = uint64_t{1} << 60;  // * 4 bytes (f32, the widest type) still fits 64 bits
constexpr size_t kMinKvBytes = 8 + 1 + 4 + 1;                   // key length, 1-byte key, type, 1-byte value
constexpr size_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;   // name length, 1-byte name, n_dims, 1 dim, type, offset

class GgufParser {
 public:
  explicit GgufParser(std::shared_ptr<MappedFile> file) : file_(std::move(file)), r_(file_->bytes(), file_->path()) {}

  ModelFile parse(bool metadata_only = false) {
    ModelFile m;
    m.path = file_->path();
    m.format = "gguf";
    m.files.push_back(file_);

    read_header();
    for (uint64_t i = 0; i < kv_count_; ++i) read_kv(m, i);
    if (metadata_only) return m;
    uint64_t alignment = read_alignment(m);

    struct Info {
      WeightTensor t;
      uint64_t rel_offset;
      size_t info_offset;
    };
    std::vector<Info> infos;
    infos.reserve(static_cast<size_t>(tensor_count_));  // bounded by the file size (read_header)
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      Info info;
      info.info_offset = r_.offset();
      info.t = read_tensor_info(i, info.rel_offset);
      infos.push_back(std::move(info));
    }

    // The data section starts at the end of the tensor infos, rounded up to the alignment.
    uint64_t pos = r_.offset();
    uint64_t data_start = pos % alignment == 0 ? pos : pos + (alignment - pos % alignment);
    uint64_t size = file_->size();
    if (tensor_count_ > 0 && data_start > size)
      fail("{}: data section would start at offset {} (tensor infos end at {}, alignment {}), past the end of the "
           "file ({} bytes)", path(), data_start, pos, alignment, size);

    for (auto& info : infos) {
      WeightTensor& t = info.t;
      if (info.rel_offset % alignment != 0)
        fail("{}: tensor {} (info at offset {}): data offset {} is not a multiple of the alignment {}", path(), printable(t.name),
             info.info_offset, info.rel_offset, alignment);
      uint64_t room = size - data_start;
      if (info.rel_offset > room || t.nbytes > room - info.rel_offset)
        fail("{}: tensor {} (info at offset {}): data at offset {} + {} bytes lies past the end of the file ({} bytes)",
             path(), printable(t.name), info.info_offset, data_start + info.rel_offset, t.nbytes, size);
      t.file_offset = data_start + info.rel_offset;
      t.data = file_->data() + t.file_offset;
      // A NaN or infinite block scale would poison every dot product that reads the block.
      if (const quant::QuantType* q = quant::quant_type(t.dtype)) {
        const int64_t n_blocks = t.numel() / q->block_size;
        if (int64_t bad = q->find_bad_scale(t.data, n_blocks); bad >= 0)
          fail("{}: tensor {} ({}): block {} of {} (file offset {}) has a non-finite scale", path(), printable(t.name), q->name, bad,
               n_blocks, t.file_offset + static_cast<uint64_t>(bad * q->block_bytes));
      }
    }

    // No two tensors may share bytes (a damaged or malicious offset table could alias weights).
    std::vector<const WeightTensor*> by_offset;
    by_offset.reserve(infos.size());
    for (auto& info : infos) by_offset.push_back(&info.t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const WeightTensor* a, const WeightTensor* b) { return a->file_offset < b->file_offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const WeightTensor* a = by_offset[i - 1];
      const WeightTensor* b = by_offset[i];
      if (a->nbytes > 0 && b->nbytes > 0 && a->file_offset + a->nbytes > b->file_offset)
        fail("{}: tensors {} (offset {}, {} bytes) and {} (offset {}) overlap", path(), printable(a->name), a->file_offset,
             a->nbytes, printable(b->name), b->file_offset);
    }

    for (auto& info : infos) m.add_tensor(std::move(info.t));
    return m;
  }

 private:
  const std::string& path() const { return file_->path(); }

  void read_header() {
    auto magic = r_.read_bytes(4, "magic");
    if (magic != "GGUF")
      fail("{}: bad magic: not a GGUF file (first bytes {:02x} {:02x} {:02x} {:02x})", path(),
           static_cast<uint8_t>(magic[0]), static_cast<uint8_t>(magic[1]), static_cast<uint8_t>(magic[2]),
           static_cast<uint8_t>(magic[3]));
    uint32_t version = r_.read<uint32_t>("version");
    if (version == 0x02000000u || version == 0x03000000u)
      fail("{}: big-endian GGUF files are not supported (version field at offset 4)", path());
    if (version == 1)
      fail("{}: unsupported GGUF version 1 (32-bit counts; re-convert the model, versions 2 and 3 are supported)",
           path());
    if (version != 2 && version != 3)
      fail("{}: unsupported GGUF version {} at offset 4 (versions 2 and 3 are supported)", path(), version);
    size_t at = r_.offset();
    tensor_count_ = r_.read<uint64_t>("tensor count");
    kv_count_ = r_.read<uint64_t>("metadata kv count");
    // Cheap plausibility checks before anything is allocated: every entry needs some bytes.
    if (kv_count_ > r_.remaining() / kMinKvBytes)
      fail("{}: metadata kv count {} at offset {} is too large for the {} bytes left in the file", path(), kv_count_,
           at + 8, r_.remaining());
    if (tensor_count_ > r_.remaining() / kMinTensorInfoBytes)
      fail("{}: tensor count {} at offset {} is too large for the {} bytes left in the file", path(), tensor_count_,
           at, r_.remaining());
  }

  std::string read_string(std::string_view what) {
    size_t at = r_.offset();
    uint64_t n = r_.read<uint64_t>(what);
    if (n > r_.remaining())
      fail("{}: {} at offset {}: string length {} exceeds the {} bytes left in the file", path(), what, at, n,
           r_.remaining());
    return std::string(r_.read_bytes(static_cast<size_t>(n), what));
  }

  void read_kv(ModelFile& m, uint64_t index) {
    size_t at = r_.offset();
    std::string what = fmt::format("key of metadata entry {}", index);
    std::string key = read_string(what);
    if (key.empty()) fail("{}: metadata entry {} at offset {} has an empty key", path(), index, at);
    if (key.size() > kMaxKeyBytes)
      fail("{}: metadata entry {} at offset {}: key {} is longer than {} bytes", path(), index, at, printable(key), kMaxKeyBytes);
    what = fmt::format("metadata {}", printable(key));
    uint32_t type = r_.read<uint32_t>(what);
    if (type >= kValueTypeCount)
      fail("{}: metadata {} at offset {}: unknown value type {}", path(), printable(key), at, type);
    nlohmann::ordered_json value = read_value(static_cast<ValueType>(type), what, 0);
    if (m.metadata.contains(key)) fail("{}: duplicate metadata key {} at offset {}", path(), printable(key), at);
    m.metadata[key] = std::move(value);
  }

  nlohmann::ordered_json read_value(ValueType t, const std::string& what, int depth) {
    switch (t) {
      case ValueType::UInt8: return r_.read<uint8_t>(what);
      case ValueType::Int8: return r_.read<int8_t>(what);
      case ValueType::UInt16: return r_.read<uint16_t>(what);
      case ValueType::Int16: return r_.read<int16_t>(what);
      case ValueType::UInt32: return r_.read<uint32_t>(what);
      case ValueType::Int32: return r_.read<int32_t>(what);
      case ValueType::UInt64: return r_.read<uint64_t>(what);
      case ValueType::Int64: return r_.read<int64_t>(what);
      case ValueType::Float32: return static_cast<double>(r_.read<float>(what));
      case ValueType::Float64: return r_.read<double>(what);
      case ValueType::Bool: {
        size_t at = r_.offset();
        uint8_t b = r_.read<uint8_t>(what);
        if (b > 1) fail("{}: {} at offset {}: bool value {} is neither 0 nor 1", path(), what, at, b);
        return b == 1;
      }
      case ValueType::String: return read_string(what);
      case ValueType::Array: return read_array(what, depth);
    }
    fail("{}: {}: unknown value type", path(), what);
  }

  nlohmann::ordered_json read_array(const std::string& what, int depth) {
    size_t at = r_.offset();
    if (depth >= kMaxArrayDepth)
      fail("{}: {} at offset {}: arrays nested more than {} deep", path(), what, at, kMaxArrayDepth);
    uint32_t type = r_.read<uint32_t>(what);
    if (type >= kValueTypeCount)
      fail("{}: {} at offset {}: unknown array element type {}", path(), what, at, type);
    uint64_t n = r_.read<uint64_t>(what);
    auto et = static_cast<ValueType>(type);
    if (n > r_.remaining() / min_value_bytes(et))
      fail("{}: {} at offset {}: array length {} of {} exceeds the {} bytes left in the file", path(), what, at, n,
           value_type_name(type), r_.remaining());
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    arr.get_ref<nlohmann::ordered_json::array_t&>().reserve(static_cast<size_t>(n));
    for (uint64_t i = 0; i < n; ++i) arr.push_back(read_value(et, what, depth + 1));
    return arr;
  }

  uint64_t read_alignment(const ModelFile& m) {
    if (!m.metadata.contains("general.alignment")) return 32;
    const auto& v = m.metadata.at("general.alignment");
    if (!v.is_number_integer()) fail("{}: metadata general.alignment must be an integer, got {}", path(), v.type_name());
    if (v.is_number_unsigned()) {
      uint64_t a = v.get<uint64_t>();
      if (a != 0 && (a & (a - 1)) == 0) return a;
      fail("{}: metadata general.alignment {} must be a nonzero power of two", path(), a);
    }
    fail("{}: metadata general.alignment {} must be a nonzero power of two", path(), v.get<int64_t>());
  }

 public:
  // Every tensor info's name, ggml type and shape, the types not checked (info's listing of a file
  // whose types cannot be read).
  std::vector<GgufTensorListing> list() {
    ModelFile m;
    read_header();
    for (uint64_t i = 0; i < kv_count_; ++i) read_kv(m, i);
    std::vector<GgufTensorListing> out;
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      uint64_t rel_offset = 0;
      GgufTensorListing e;
      WeightTensor t = read_tensor_info(i, rel_offset, &e.ggml_type);
      e.name = t.name;
      e.shape = t.shape;
      e.type = ggml_type_str(e.ggml_type);
      e.type = e.type.substr(0, e.type.find(' '));
      e.supported = dtype_from_ggml(e.ggml_type).has_value();
      e.nbytes = e.supported ? t.nbytes : 0;
      out.push_back(std::move(e));
    }
    return out;
  }

 private:
  // raw_type: when not null, a tensor of a type this loader does not read is returned (dtype F32,
  // nbytes 0) with its ggml type id here instead of failing.
  WeightTensor read_tensor_info(uint64_t index, uint64_t& rel_offset, uint32_t* raw_type = nullptr) {
    size_t at = r_.offset();
    WeightTensor t;
    t.name = read_string(fmt::format("name of tensor info {}", index));
    if (t.name.empty()) fail("{}: tensor info {} at offset {} has an empty name", path(), index, at);
    if (t.name.size() >= kMaxNameBytes)
      fail("{}: tensor info {} at offset {}: name {} is longer than ggml's limit of {} bytes", path(), index, at,
           printable(t.name), kMaxNameBytes - 1);
    std::string what = fmt::format("tensor info {}", printable(t.name));
    uint32_t n_dims = r_.read<uint32_t>(what);
    if (n_dims == 0 || n_dims > kMaxDims)
      fail("{}: tensor {} at offset {}: {} dimensions (1 to {} supported)", path(), printable(t.name), at, n_dims, kMaxDims);
    std::array<uint64_t, kMaxDims> ne{};
    // Bound the element count so that its byte size cannot overflow; whether the data really fits
    // the file is checked with the offsets below, with a message saying so.
    const uint64_t limit = kMaxElements;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ne[d] = r_.read<uint64_t>(what);
      if (ne[d] == 0) fail("{}: tensor {} at offset {}: dimension {} is zero", path(), printable(t.name), at, d);
      if (ne[d] > limit || numel > limit / ne[d])
        fail("{}: tensor {} at offset {}: element count overflows (more than 2^60 elements)", path(), printable(t.name), at);
      numel *= ne[d];
    }
    uint32_t type = r_.read<uint32_t>(what);
    rel_offset = r_.read<uint64_t>(what);
    auto dtype = dtype_from_ggml(type);
    if (raw_type) {
      *raw_type = type;
      if (!dtype) {
        for (uint32_t d = n_dims; d-- > 0;) t.shape.push_back(static_cast<int64_t>(ne[d]));
        return t;
      }
    }
    if (!dtype)
      fail("{}: tensor {} at offset {}: unsupported tensor type {} (supported: {})", path(), printable(t.name), at,
           ggml_type_str(type), supported_types());
    t.dtype = *dtype;
    if (ne[0] % static_cast<uint64_t>(dtype_block_size(t.dtype)) != 0)
      fail("{}: tensor {} at offset {}: {} rows of {} elements are not a whole number of blocks of {}", path(), printable(t.name),
           at, dtype_name(t.dtype), ne[0], dtype_block_size(t.dtype));
    for (uint32_t d = n_dims; d-- > 0;) t.shape.push_back(static_cast<int64_t>(ne[d]));  // outermost first
    t.nbytes = dtype_bytes(t.dtype, static_cast<int64_t>(numel));
    return t;
  }

  std::shared_ptr<MappedFile> file_;
  ByteReader r_;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
};

}  // namespace

ModelFile load_gguf(std::shared_ptr<MappedFile> file) { return GgufParser(std::move(file)).parse(); }

ModelFile load_gguf(const std::string& path) { return load_gguf(MappedFile::open(path)); }
ModelFile load_gguf_metadata(const std::string& path) { return GgufParser(MappedFile::open(path)).parse(true); }
std::vector<GgufTensorListing> list_gguf_tensors(const std::string& path) { return GgufParser(MappedFile::open(path)).list(); }

}  // namespace mk
