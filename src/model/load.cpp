// load_model: picks the loader from what is at `path` (a directory: Hugging Face; a GGUF file by its magic; or
// otherwise a llama2.c checkpoint, whose loader rejects anything that is not one).
#include <cstring>
#include <filesystem>
#include <system_error>

#include "model/model_file.h"
#include "support/error.h"

namespace mk {

ModelFile load_model(const std::string& path) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) fail("{}: no such file or directory", path);
  if (ec) fail("{}: cannot access: {}", path, ec.message());
  if (std::filesystem::is_directory(status)) return load_hf_dir(path);
  auto file = MappedFile::open(path);
  if (file->size() >= 4 && std::memcmp(file->data(), "GGUF", 4) == 0) return load_gguf(std::move(file));
  try {
    return load_llama2c(std::move(file));
  } catch (const Error& e) {
    fail("{}: not a GGUF file (no GGUF magic), a Hugging Face directory, or a valid llama2.c checkpoint: {}", path,
         e.what());
  }
}

ModelFile load_model_vocab(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return load_hf_dir(path);
  {
    auto file = MappedFile::open(path);
    if (file->size() < 4 || std::memcmp(file->data(), "GGUF", 4) != 0)
      fail("{}: not a GGUF file or a Hugging Face directory; only those carry a vocabulary", path);
  }
  return load_gguf_metadata(path);
}

}  // namespace mk
