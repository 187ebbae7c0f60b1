// A loaded model file: metadata plus named weight tensors, independent of the on-disk format.
//
// Loaders (gguf.cpp, llama2c.cpp, safetensors/hf) fill a ModelFile. Tensor shapes are written
// outermost first, row-major (a linear layer's weight is [n_out, n_in], as in PyTorch; GGUF's
// ne[] order is reversed on load). Tensor data points into the mmap'd file, which the ModelFile
// keeps alive, or into `owned` buffers for converted data.
//
// Metadata uses GGUF key names (`general.architecture`, `llama.embedding_length`, ...): the
// llama2.c loader synthesises them, so architecture descriptions read one vocabulary of keys.
// HF directories keep config.json under `hf.config`.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "support/mmap.h"

namespace mk {

struct WeightTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // outermost first
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  uint64_t file_offset = 0;  // offset of the data in its file (for `info`)
  // Made at load from the file's tensors (a row view, an alias, a converted copy), not a tensor of
  // the file: `info` leaves it out of the listing and the totals.
  bool derived = false;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[64, 512]"

// The error for a tensor whose shape is not the one the architecture needs, naming the model file
// (or HF directory) and the tensor: "<path>: tensor <name> has shape [96, 32], expected [32, 96]
// (transposed?)"; the hint when the shape is the expected one reversed.
[[noreturn]] void fail_tensor_shape(const std::string& path, const WeightTensor& t, const std::vector<int64_t>& expected);

// Rows [row0, row0 + n_rows) of a 2-D tensor (or elements of a 1-D one) as a tensor named `name`
// sharing its data (fused projections split at load: HF Phi-3, GGUF phi3).
WeightTensor row_view(const WeightTensor& t, int64_t row0, int64_t n_rows, std::string name);

class ModelFile {
 public:
  std::string path;
  std::string format;  // "gguf", "llama2c", "hf"
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();

  void add_tensor(WeightTensor t);  // throws on a duplicate name
  const std::vector<WeightTensor>& tensors() const { return tensors_; }
  const WeightTensor* find(const std::string& name) const;
  // Throws mk::Error "<path>: missing tensor <name>" when absent.
  const WeightTensor& get(const std::string& name) const;
  // Throws mk::Error "<name>: expected [a, b], got [c, d]" on mismatch.
  const WeightTensor& get(const std::string& name, const std::vector<int64_t>& expected_shape) const;

  // Metadata helpers: throw mk::Error naming the key when missing or of the wrong type.
  bool has(const std::string& key) const { return metadata.contains(key); }
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_float(const std::string& key, double def) const;
  std::string get_str(const std::string& key) const;

  std::vector<std::shared_ptr<MappedFile>> files;        // keep mappings alive
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned;  // converted tensor data

 private:
  std::vector<WeightTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// Opens any supported model: a GGUF file (magic "GGUF"), a Hugging Face directory (config.json),
// or a llama2.c checkpoint (anything else). Throws mk::Error naming the problem.
ModelFile load_model(const std::string& path);

ModelFile load_gguf(const std::string& path);
ModelFile load_gguf(std::shared_ptr<MappedFile> file);
// GGUF phi3: registers the parts of the fused attn_qkv / ffn_up tensors as row views (load.cpp;
// load_model calls it). Throws mk::Error when a fused tensor has the wrong shape.
void add_gguf_phi3_views(ModelFile& m);
// The views a GGUF family's fused tensors need (phi3, gpt2, phi2), by general.architecture; what
// load_model does after load_gguf.
void add_gguf_views(ModelFile& m);
// GGUF gpt2's and phi2's fused blk.N.attn_qkv.{weight,bias} as attn_q/attn_k/attn_v views (model/load.cpp).
void add_gguf_qkv_views(ModelFile& m, const std::string& arch);
// Header and metadata only (no tensor infos): enough for the vocabulary, and works for vocab-only
// files and for files whose tensor types cannot be run.
ModelFile load_gguf_metadata(const std::string& path);
// A GGUF file's tensor infos as listed (name, ggml type name such as "iq4_xs", shape outermost
// first, bytes where the type is one this loader reads, else 0), whatever their types: what `info`
// shows of a file that load_model refuses for a type. Throws mk::Error on a damaged header.
struct GgufTensorListing {
  std::string name, type;
  uint32_t ggml_type = 0;
  std::vector<int64_t> shape;
  size_t nbytes = 0;
  bool supported = false;
};
std::vector<GgufTensorListing> list_gguf_tensors(const std::string& path);
// What the tokenizer of the model at `path` needs, without reading weights: GGUF metadata, or for
// an HF directory its config files (tokenizer.json is read by load_hf_tokenizer). Throws like load_model.
ModelFile load_model_vocab(const std::string& path);
ModelFile load_llama2c(const std::string& path);
ModelFile load_llama2c(std::shared_ptr<MappedFile> file);
// A Hugging Face model directory (config.json + safetensors weights); see model/hf.h. with_weights
// false: config.json and generation_config.json only (no tensors; the safetensors are not opened).
ModelFile load_hf_dir(const std::string& dir, bool with_weights = true);

}  // namespace mk
