// Reader for the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON header, then the data section. The header maps
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} with offsets relative to the
// data section; an optional "__metadata__" object maps strings to strings.
//
// Every field is checked before use: the header must fit the file and be a JSON object, dtypes
// must be F32, F16 or BF16 (others fail naming the dtype), the byte range of a tensor must lie in
// the data section with end - begin == numel x dtype size, and tensors must not overlap. Errors
// throw mk::Error naming the file and the tensor.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "model/model_file.h"
#include "support/mmap.h"

namespace mk {

struct SafetensorsInfo {
  size_t n_tensors = 0;
  std::map<std::string, std::string> metadata;  // the "__metadata__" object, if any
};

// Adds every tensor of `file` to `model` (HF names, shapes as stored, data pointing into the
// mapping) and keeps the mapping alive in model.files. Throws on duplicate names.
SafetensorsInfo add_safetensors(ModelFile& model, std::shared_ptr<MappedFile> file);

// One standalone .safetensors file as a ModelFile with format "safetensors" and no metadata.
ModelFile load_safetensors(const std::string& path);

}  // namespace mk
