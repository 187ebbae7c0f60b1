// The JSON constraint's token mask (runtime/json_prefix.h: JsonTokenMask::allowed) inside a string
// value, over SmolLM2's vocabulary (49152 tokens; the benchmark is skipped when the model is not in
// ~/.cache/megakernel/models): a plain string, and strings under `format`s / a `pattern` (their
// position automata, runtime/string_pattern.h). The mask is computed once per generated token.
// Run: build/bench/mk_bench --benchmark_filter=BM_JsonMask
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/model_file.h"
#include "model/tokenizer.h"
#include "runtime/json_prefix.h"

using namespace mk;

namespace {

const JsonTokenMask* smollm2_mask() {
  static std::unique_ptr<JsonTokenMask> mask = [] {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const std::string dir = xdg && *xdg ? std::string(xdg) : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache";
    const std::string path = dir + "/megakernel/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(path)) return std::unique_ptr<JsonTokenMask>();
    const ModelFile m = load_model(path);
    const auto tok = load_model_tokenizer(m);
    return JsonTokenMask::of(*tok, tok->n_vocab());
  }();
  return mask.get();
}

// `text` fed after the schema's start: the mask is taken inside the string value.
void BM_JsonMask(benchmark::State& state, const char* property_schema, const char* text) {
  const JsonTokenMask* mask = smollm2_mask();
  if (!mask) {
    state.SkipWithError("SmolLM2-135M-Instruct.Q4_1.gguf is not in ~/.cache/megakernel/models");
    return;
  }
  const auto schema = JsonSchema::compile(nlohmann::ordered_json::parse(
      std::string(R"({"type": "object", "properties": {"a": )") + property_schema + R"(}, "required": ["a"]})"));
  JsonPrefix p(*schema);
  if (!p.feed(std::string(R"({"a": ")") + text)) {
    state.SkipWithError("the text does not fit the schema");
    return;
  }
  std::vector<uint8_t> allowed;
  int64_t n = 0;
  for (auto _ : state) benchmark::DoNotOptimize(n = mask->allowed(p, allowed));
  state.counters["allowed"] = static_cast<double>(n);
}

BENCHMARK_CAPTURE(BM_JsonMask, plain_string, R"({"type": "string"})", "Hello wor")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_JsonMask, date_time, R"({"type": "string", "format": "date-time"})", "2026-12-0")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_JsonMask, email, R"({"type": "string", "format": "email"})", "ann.lee")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_JsonMask, uuid, R"({"type": "string", "format": "uuid"})", "0f8fad5b-d9cb-")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_JsonMask, pattern_words, R"({"type": "string", "pattern": "^[A-Za-z ]{1,80}$"})", "Hello wor")->Unit(benchmark::kMillisecond);

}  // namespace
