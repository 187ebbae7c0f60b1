// The table of architecture descriptions; each family file defines its builder, registry.cpp lists them.
#pragma once
#include "archs/blocks.h"
#include "support/error.h"

namespace mk {

Hparams read_gguf_llama_hparams(const ModelFile& m);
Graph build_gguf_llama(const ModelFile& m, const BuildOptions& o);

}  // namespace mk
