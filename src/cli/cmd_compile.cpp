#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "archs/arch.h"
#include "backend/cuda/codegen.h"
#include "cli/commands.h"
#include "passes/pass.h"
#include "runtime/session.h"
#include "support/error.h"

namespace mk::cli {

// --emit cuda without -t: one block per SM of an H200 (132 SMs), what the cuda backend uses there.
constexpr int kCudaDefaultBlocks = 132;

void add_compile_command(CLI::App& app) {
  struct Opts {
    std::string model, emit = "program", out, schedule = "dynamic";
    int threads = 0;
    int64_t n_ctx = 0, max_tokens = 256, attn_splits = -1;
    bool all_logits = false, embeddings = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("compile", "compile a model and print its IR or instruction program");
  cmd->add_option("-m,--model", o->model, "model: GGUF file, llama2.c .bin, HF directory, synth:<name>")->required();
  cmd->add_option("--emit", o->emit,
                  "graph: the architecture's graph before any pass; ir: the graph after the graph passes; program: one line per instruction and a summary; "
                  "program-full: weights, buffers, ops, counters, instructions, lists; "
                  "cuda: the megakernel source the cuda backend compiles (for an H100/H200 unless -t says otherwise)")
      ->check(CLI::IsMember({"graph", "ir", "program", "program-full", "cuda"}));
  cmd->add_option("-o,--output", o->out, "write to this file instead of stdout (-: stdout)")
      ->check(CLI::Validator(
          [](std::string& s) { return s.empty() ? std::string("must not be empty (leave -o out for stdout)") : std::string(); },
          "FILE"));
  // At most 65536: a GPU's blocks (132 SMs on an H200) or CPU threads, with room to spare; the
  // program's tables grow with the workers (2^31 of them took 17 GB before failing).
  cmd->add_option("-t,--threads", o->threads, "workers the program is tiled and scheduled for (0 = all cores, at most 65536)")
      ->transform(integer_range(0, 65536));
  cmd->add_option("--schedule", o->schedule, "dynamic, static-rr or static-cp")
      ->check(schedule_name());
  cmd->add_option("-c,--ctx-size", o->n_ctx, "context length (0 = the model's, at most 4096)")
      ->transform(integer_at_least(0));
  auto* max_tokens_opt = cmd->add_option("--max-tokens", o->max_tokens, "most tokens per step (buffers are sized for it)")
      ->transform(integer_at_least(1));
  auto* all_logits = cmd->add_flag("--all-logits", o->all_logits, "logits for every position");
  cmd->add_flag("--embeddings", o->embeddings, "the embedding graph (embed, serve --embeddings): the output norm's rows, no logits")
      ->excludes(all_logits);
  cmd->add_option("--attn-splits", o->attn_splits,
                  "flash-decoding splits of attention (0 = auto; default: auto for --emit cuda, else 1)")
      ->transform(integer_range(0, 64));
  cmd->callback([o, max_tokens_opt] {
    ModelFile model = open_model(o->model, /*with_data=*/false);  // shapes are all compile needs
    Hparams hp = read_hparams(model);
    const int64_t n_ctx = resolve_n_ctx(hp, o->n_ctx);  // as run and serve: not past the training context
    BuildOptions bo{n_ctx, o->all_logits};
    bo.embeddings = o->embeddings;
    Graph g = build_graph(model, bo);
    CompileOptions co;
    co.workers = o->threads > 0 ? o->threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (o->emit == "cuda" && o->threads <= 0) co.workers = kCudaDefaultBlocks;
    co.schedule = schedule_from_name(o->schedule);
    co.max_tokens = std::min(o->max_tokens, n_ctx);
    if (max_tokens_opt->count() > 0 && o->max_tokens > n_ctx)  // the default 256 is cut silently
      std::fprintf(stderr, "note: --max-tokens %lld is more than the context: %lld rows per step\n",
                   static_cast<long long>(o->max_tokens), static_cast<long long>(n_ctx));
    co.attn_splits = o->attn_splits >= 0 ? o->attn_splits : o->emit == "cuda" ? 0 : 1;  // the backends' defaults
    co.rms_partials = o->emit == "cuda";
    const int64_t cuda_smem = 227 * 1024 - 1024;  // the backend's budget on an H100/H200 (227 KB opt-in)
    if (o->emit == "cuda") {
      cuda::apply_env(co);
      cuda::apply_device_limits(co, cuda_smem, cuda::CudaCodegenOptions{}.threads);
    }
    PassContext cx = o->emit == "graph" ? PassContext{g, {}, co, false} : run_pipeline(g, co);
    std::string text = o->emit == "graph" ? g.str() : o->emit == "ir" ? cx.graph.str() : o->emit == "program" ? cx.program.listing() : cx.program.str();
    if (o->emit == "cuda") {  // the backend's settings on an H100/H200: 227 KB of opt-in shared memory
      cuda::CudaCodegenOptions cg;
      cg.max_smem_bytes = cuda_smem;
      cg.weight_dtypes = cuda::device_weight_dtypes(cx.program);
      cg.perop_kernels = false;  // what --backend cuda compiles (cuda-perop/cuda-graph add one kernel per function)
      cuda::apply_env(cg);
      text = cuda::generate_cuda(cx.program, cg).code;
    }
    // The program lays the KV cache out in float32 (cuda and cuda-emu keep it so); the cpu backend's
    // default for a llama.cpp-like GGUF stores it as f16, in half the bytes (it was reported as the
    // float32 size only, twice what `run` allocates).
    std::string kv_note;
    if (o->emit != "graph" && o->emit != "ir" && o->emit != "cuda" && cpu_llama_cpp_numerics(model))
      kv_note = fmt::format("  kv cache on the cpu backend: {} bytes (f16, its default for this GGUF: --kv-type auto)\n",
                            cx.program.kv_bytes / 2);
    if (o->emit == "program") text += kv_note;
    if (o->out.empty() || o->out == "-") {
      std::fwrite(text.data(), 1, text.size(), stdout);
      return;
    }
    std::ofstream f(o->out, std::ios::binary);
    if (!f) fail("{}: cannot open for writing: {}", o->out, std::strerror(errno));
    f << text;
    if (!f) fail("{}: write failed", o->out);
    // graph is the architecture's graph before any pass: no program was built, so no summary of one
    std::fprintf(stderr, "wrote %s\n%s%s", o->out.c_str(), o->emit == "graph" ? "" : cx.program.summary().c_str(), kv_note.c_str());
  });
}

}  // namespace mk::cli
