// Golden IR tests: tests/ir/<pass>/*.ir hold an input, the pass to run and the expected text.
//
//   # pass: fuse
//   # options: workers=2 max_tokens=4 schedule=dynamic
//   # input
//   graph { ... }
//   # expected
//   graph { ... }            (graph passes)   or   program ... (program passes: tile .. validate)
//
// Graph passes run alone on the input graph; program passes run the program part of the pipeline
// (tile up to the named pass) on it. The verifier runs after every pass. MK_UPDATE_GOLDEN=1
// rewrites the expected sections — read the diff before committing it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <fstream>
#include <sstream>

#include "passes/pass.h"
#include "support/error.h"

using namespace mk;
namespace fs = std::filesystem;

namespace {

struct Golden {
  std::string pass, options, input, expected;
};

Golden read_golden(const fs::path& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  Golden g;
  auto header = [&](const std::string& key) {
    auto at = text.find("# " + key + ":");
    if (at == std::string::npos) return std::string();
    auto end = text.find('\n', at);
    std::string v = text.substr(at + key.size() + 3, end - at - key.size() - 3);
    while (!v.empty() && v.front() == ' ') v.erase(v.begin());
    return v;
  };
  g.pass = header("pass");
  g.options = header("options");
  auto in = text.find("# input\n"), ex = text.find("# expected\n");
  if (in == std::string::npos) throw Error(path.string() + ": no '# input' section");
  g.input = text.substr(in + 8, ex == std::string::npos ? std::string::npos : ex - in - 8);
  if (ex != std::string::npos) g.expected = text.substr(ex + 11);
  return g;
}

CompileOptions parse_options(const std::string& s) {
  CompileOptions o;
  std::istringstream in(s);
  std::string kv;
  while (in >> kv) {
    auto eq = kv.find('=');
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "workers") o.workers = std::stoi(v);
    else if (k == "max_tokens") o.max_tokens = std::stoll(v);
    else if (k == "schedule") o.schedule = schedule_from_name(v);
    else if (k == "tile_bytes") o.tile_bytes = std::stoll(v);
    else if (k == "attn_splits") o.attn_splits = std::stoll(v);
    else throw Error("unknown golden option " + k);
  }
  return o;
}

std::string run_golden(const Golden& g) {
  Graph input = parse_graph(g.input);
  CompileOptions o = parse_options(g.options);
  for (const Pass& p : default_pipeline()) {
    if (p.name != g.pass) continue;
    if (p.on_graph) {
      PassContext cx;
      cx.graph = input;
      cx.options = o;
      p.run(cx);
      verify_graph(cx.graph);
      return cx.graph.str();
    }
    o.skip = {"dce", "fuse"};
    PassContext cx = run_pipeline(input, o, g.pass);
    if (p.name == "validate") return "valid\n" + cx.program.summary();
    return cx.program.str();
  }
  throw Error("unknown pass " + g.pass);
}

std::vector<fs::path> golden_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(MK_SOURCE_DIR) / "tests" / "ir"))
    if (e.path().extension() == ".ir") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST(IrGolden, EveryPassHasGoldenTests) {
  std::set<std::string> covered;
  for (const auto& f : golden_files()) covered.insert(read_golden(f).pass);
  for (const Pass& p : default_pipeline()) EXPECT_TRUE(covered.count(p.name)) << "no golden test for pass " << p.name;
}

TEST(IrGolden, OutputsMatch) {
  const bool update = std::getenv("MK_UPDATE_GOLDEN") && std::string(std::getenv("MK_UPDATE_GOLDEN")) == "1";
  auto files = golden_files();
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    Golden g = read_golden(f);
    std::string got;
    try {
      got = run_golden(g);
    } catch (const Error& e) {
      got = std::string("error: ") + e.what() + "\n";
    }
    if (update) {
      std::ifstream in(f);
      std::stringstream ss;
      ss << in.rdbuf();
      std::string text = ss.str();
      auto ex = text.find("# expected\n");
      text = (ex == std::string::npos ? text : text.substr(0, ex)) + "# expected\n" + got;
      std::ofstream(f) << text;
      continue;
    }
    EXPECT_EQ(got, g.expected) << "(MK_UPDATE_GOLDEN=1 regenerates; read the diff)";
  }
}

TEST(IrGolden, PipelineVerifiesAfterEveryPass) {
  // A pass that breaks the IR is reported with the pass's name.
  Graph g = parse_graph(
      "graph {\n  %0 = input {kind=\"tokens\"} : i32[n_tokens]\n  %1 = weight @t : f32[10, 4]\n"
      "  %2 = embed %1, %0 : f32[n_tokens, 4]\n  output %2 \"x\"\n}\n");
  CompileOptions o;
  PassContext cx = run_pipeline(g, o);
  EXPECT_EQ(cx.program.instrs.size(), 1u);
  g.outputs[0].value = 7;
  try {
    run_pipeline(g, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output x names undefined value %7"), std::string::npos) << e.what();
  }
}
