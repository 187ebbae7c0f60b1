// SmolLM3 (SmolLM3ForCausalLM): the Llama layout whose every fourth layer (by default) attends
// without RoPE ("NoPE": the causal mask alone orders the tokens there).
//   HF: config `no_rope_layers` (one 0/1 per layer, 1 = RoPE), else every layer il with
//       (il + 1) % no_rope_layer_interval == 0 (default 4) skips it; transformers modeling_smollm3.py.
//   GGUF "smollm3": written by llama.cpp's converter as Llama (q/k permuted: RoPE on adjacent pairs);
//       llama.cpp skips RoPE where (il + 1) % 4 == 0 (LLM_ARCH_SMOLLM3's n_no_rope_layer_step, no key).
#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "support/error.h"
#include "support/json.h"

namespace mk {

namespace {

std::vector<bool> nope_every(int64_t n_layer, int64_t interval) {
  std::vector<bool> r(static_cast<size_t>(n_layer));
  for (int64_t il = 0; il < n_layer; ++il) r[static_cast<size_t>(il)] = (il + 1) % interval == 0;
  return r;
}

}  // namespace

Graph build_gguf_smollm3(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "adjacent");
  s.nope_layers = nope_every(s.hp.n_layer, 4);
  return build_decoder(m, s);
}

Graph build_hf_smollm3(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  if (config_bool(c, "use_sliding_window", false)) fail("config.json: SmolLM3 use_sliding_window true is not supported");
  DecoderSpec s = hf_llama_spec(m, o, /*tied_default=*/true);  // SmolLM3Config ties by default
  const int64_t n_layer = s.hp.n_layer;
  if (c.contains("no_rope_layers") && !c["no_rope_layers"].is_null()) {
    const auto& l = c["no_rope_layers"];
    if (!l.is_array() || static_cast<int64_t>(l.size()) != n_layer)
      fail("config.json: no_rope_layers must list 0 or 1 for each of the {} layers, got {}", n_layer, clip(l.dump()));
    s.nope_layers.assign(static_cast<size_t>(n_layer), false);
    for (size_t i = 0; i < l.size(); ++i) {
      if (!l[i].is_number_integer() || (l[i].get<int64_t>() != 0 && l[i].get<int64_t>() != 1))
        fail("config.json: no_rope_layers[{}] = {} must be 0 or 1 (1: the layer uses RoPE)", i, clip(l[i].dump()));
      s.nope_layers[i] = l[i].get<int64_t>() == 0;
    }
  } else {
    int64_t interval = 4;
    if (c.contains("no_rope_layer_interval") && !c["no_rope_layer_interval"].is_null()) {
      const auto& v = c["no_rope_layer_interval"];
      if (!v.is_number_integer() || v.get<int64_t>() < 1)
        fail("config.json: no_rope_layer_interval = {} must be a positive integer", clip(v.dump()));
      interval = v.get<int64_t>();
    }
    s.nope_layers = nope_every(n_layer, interval);
  }
  return build_decoder(m, s);
}

}  // namespace mk
