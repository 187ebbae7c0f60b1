#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend/cuda/copy_bench.h"
#include "cli/commands.h"

namespace mk::cli {

void add_bench_copy_command(CLI::App& app) {
  struct Opts {
    size_t mib = 1024;
    int reps = 20;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench-copy",
                                 "measure device-to-device copy bandwidth (bytes read + written per second), as JSON");
  cmd->add_option("--mib", o->mib, "size of one copy in MiB")->transform(integer_range(1, 65536));
  cmd->add_option("--reps", o->reps, "timed copies (median reported)")->transform(integer_range(1, 1000));
  cmd->callback([o] {
    cuda::CopyBandwidth r = cuda::measure_copy_bandwidth(o->mib << 20, o->reps);
    nlohmann::ordered_json j;
    j["device"] = r.device;
    j["bytes"] = r.bytes;
    j["reps"] = r.reps;
    j["ms_per_copy"] = r.ms_per_copy;
    j["gbps"] = r.gbps;
    std::puts(j.dump().c_str());
  });
}

}  // namespace mk::cli
