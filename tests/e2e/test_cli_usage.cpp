// What a new user meets first: option values, synthetic model paths, `info`'s label, a damaged
// tokenizer, the reference backend's flags. Each case runs the CLI as a user would and reads its
// exit status and its words.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>

#include <unistd.h>

#include "support/cli.h"

namespace {

struct Result {
  int status = 0;
  std::string out, err;
};

Result cli(const std::string& args) {
  Result r;
  r.out = mk::test::run_cli(args, &r.status, &r.err);
  return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Inputs that did nothing, or were named wrongly, without a word (new-user trial 32).
TEST(E2ECliUsage, SilentOrMisleadingInputsAreNamed) {
  // compile -o "" wrote to stdout
  Result r = cli("compile -m synth:tiny -o \"\"");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--output: must not be empty (leave -o out for stdout)")) << r.err;
  // compile -o - wrote a file named "-" (trial 48): it is stdout; run --trace "" was ignored
  r = cli("compile -m synth:tiny -o -");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "signal c0")) << r.out.substr(0, 200);
  EXPECT_FALSE(has(r.err, "wrote -")) << r.err;
  r = cli("run -m synth:tiny --ids 1,2 -n 1 --trace \"\"");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--trace: must not be empty")) << r.err;
  // an unknown pass in MK_PRINT_AFTER printed nothing
  r = Result{};
  r.out = mk::test::run_shell("MK_PRINT_AFTER=dce,bogus " + std::string(MK_CLI_PATH) + " compile -m synth:tiny -o /dev/null 2>&1",
                              &r.status);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, "error: MK_PRINT_AFTER: 'bogus' is not a pass (the passes: dce, fuse,")) << r.out;
  // logits without -c: the context is the ids', which the message says
  std::string ids = "1";
  for (int i = 0; i < 2100; ++i) ids += ",1";
  r = cli("logits -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf --ids " + ids);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "2101 ids are more than the model's training context 2048 (without -c the context is the number "
                         "of ids)")) << r.err;
  // run --json without a decode step: no rate (it said 0.0)
  r = cli("run -m synth:tiny --ids 1,2 -n 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out).at("ms_per_token").is_null()) << r.out;
  r = cli("run -m synth:tiny --ids 1,2 -n 3 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_GT(nlohmann::json::parse(r.out).at("ms_per_token").get<double>(), 0.0) << r.out;
  // --act-quant on over float weights changes no bit: said so
  r = cli("run -m synth:tiny --ids 1,2 -n 1 --act-quant on");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "note: --act-quant on: the model has no block-quantized weights")) << r.err;
  r = cli("run -m synth:tiny:q8_0 --ids 1,2 -n 1 --act-quant on");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(has(r.err, "note: --act-quant on")) << r.err;
}

// Integer options: a non-number is "not a whole number", a negative count is out of range, both
// named by their option, exit 2 (usage) before anything loads.
TEST(E2ECliUsage, IntegerOptionsSayWhatIsWrong) {
  Result r = cli("run -m synth:tiny --ids 1 --attn-splits abc");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: --attn-splits: 'abc' is not a whole number")) << r.err;
  r = cli("run -m synth:tiny --ids 1 --attn-splits 65");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "--attn-splits: 65 is out of range: it must be 0 to 64")) << r.err;
  for (const char* cmd : {"run -m synth:tiny --ids 1", "logits -m synth:tiny --ids 1", "compile -m synth:tiny --emit ir",
                          "chat -m synth:tiny", "serve -m synth:tiny"}) {
    r = cli(std::string(cmd) + " -t -1");
    EXPECT_EQ(r.status, 2) << cmd;
    // compile's -t is the workers a program is tiled for (at most 65536); the others cap at 1024 threads
    const bool threads = std::string(cmd).rfind("compile", 0) != 0;
    EXPECT_TRUE(has(r.err, threads ? "error: --threads: -1 is out of range: it must be 0 to 1024"
                                   : "error: --threads: -1 is out of range: it must be 0 to 65536"))
        << cmd << ": " << r.err;
  }
  r = cli("compile -m synth:tiny --emit program -t 2147483647");  // refused at once (it ate 17 GB)
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: --threads: 2147483647 is out of range: it must be 0 to 65536")) << r.err;
  r = cli("run -m synth:tiny --ids 1 -n 1.5");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "--n-predict: '1.5' is not a whole number")) << r.err;
  r = cli("run -m synth:tiny --ids 1 -c -4");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "--ctx-size: -4 is out of range")) << r.err;
  // 0 is the documented default (all cores) and runs.
  r = cli("run -m synth:tiny --ids 1 -n 1 -t 0");
  EXPECT_EQ(r.status, 0) << r.err;
}

// Every numeric option names itself and its accepted range, exit 2, before anything loads: values
// the target cannot hold are range errors (not CLI11's "Could not convert"), a negative --seed or
// --max-body is not wrapped around, and nan/inf are not numbers.
TEST(E2ECliUsage, NumericOptionsRefuseWhatTheyCannotHold) {
  const std::string run = "run -m synth:tiny --ids 1 -n 1 ";
  const std::pair<std::string, std::string> cases[] = {
      {run + "--seed -1", "error: --seed: -1 is out of range: it must be 0 to 18446744073709551615"},
      {run + "--seed 18446744073709551616", "--seed: 18446744073709551616 is out of range: it must be 0 to 18446744073709551615"},
      {run + "--seed abc", "error: --seed: 'abc' is not a whole number"},
      {run + "--seed 1.5", "error: --seed: '1.5' is not a whole number"},
      {run + "--top-k abc", "error: --top-k: 'abc' is not a whole number"},
      {run + "--top-k 1.5", "error: --top-k: '1.5' is not a whole number"},
      {run + "--top-k -1", "error: --top-k: -1 is out of range: it must be 0 or more"},
      {run + "--temp nan", "error: --temp: 'nan' is not a number"},
      {run + "--temp -0.5", "error: --temp: -0.5 is out of range: it must be 0 or more"},
      {run + "--temp inf", "error: --temp: inf is out of range"},
      {run + "--top-p 1.5", "error: --top-p: 1.5 is out of range: it must be more than 0 and at most 1"},
      {run + "--top-p 0", "error: --top-p: 0 is out of range: it must be more than 0 and at most 1"},
      // In range as a double, out of range as the float the sampler uses: the user's value is named.
      {run + "--top-p 1e-300", "error: --top-p: 1e-300 rounds to 0 as a 32-bit float, which is out of range: it must be more than 0 and at most 1"},
      {run + "--repeat-penalty 0", "error: --repeat-penalty: 0 is out of range: it must be more than 0 and at most 1000000"},
      {run + "--repeat-penalty 1e39", "error: --repeat-penalty: 1e39 is out of range: it must be more than 0 and at most 1000000"},
      {run + "--repeat-penalty 2e6", "error: --repeat-penalty: 2e6 is out of range: it must be more than 0 and at most 1000000"},
      {run + "-l 5", "error: --logit-bias: '5' is not TOKEN_ID followed by a signed bias (15043+1, 15043-1.5)"},
      {run + "-l 5+101", "error: --logit-bias: the bias of token 5 must be between -100 and 100, got 101"},
      {run + "-l 5+nan", "error: --logit-bias: the bias of token 5 must be between -100 and 100"},
      {run + "--logit-bias 3000000000+1", "error: --logit-bias: token id 3000000000 is out of range"},
      {run + "-l 99999999+1", "error: --logit-bias: token 99999999 is outside the vocabulary"},  // known once loaded
      {"chat -m synth:tiny --top-p 1e-46", "error: --top-p: 1e-46 rounds to 0 as a 32-bit float"},
      {run + "--temp 1e39", "error: --temp: 1e39 rounds to inf as a 32-bit float, which is out of range: it must be 0 or more"},
      {"run -m synth:tiny --ids 1 -n 3000000000", "error: --n-predict: 3000000000 is out of range: it must be at most 2147483647"},
      {"run -m synth:tiny --ids 1 -n 99999999999999999999", "--n-predict: 99999999999999999999 is out of range: it must be at most 2147483647"},
      {run + "-t 3000000000", "error: --threads: 3000000000 is out of range: it must be 0 to 1024"},
      {run + "-t 5000", "error: --threads: 5000 is out of range: it must be 0 to 1024"},
      {"logits -m synth:tiny --ids 1 -t 1025", "error: --threads: 1025 is out of range: it must be 0 to 1024"},
      {"chat -m synth:tiny --seed -1", "error: --seed: -1 is out of range"},
      {"chat -m synth:tiny --top-k 1.5", "error: --top-k: '1.5' is not a whole number"},
      {"compile -m synth:tiny --emit ir --max-tokens 0", "error: --max-tokens: 0 is out of range: it must be 1 or more"},
      {"serve -m synth:tiny --max-body -3", "error: --max-body: -3 is out of range: it must be 1 to 1099511627776"},
      {"serve -m synth:tiny --max-body abc", "error: --max-body: 'abc' is not a whole number"},
      {"serve -m synth:tiny --max-body 0", "error: --max-body: 0 is out of range"},
      {"serve -m synth:tiny --timeout nan", "error: --timeout: 'nan' is not a number"},
      {"serve -m synth:tiny --timeout -1", "error: --timeout: -1 is out of range: it must be 0 to 31536000"},
      {"serve -m synth:tiny --timeout 1e300", "error: --timeout: 1e300 is out of range"},
      {"serve -m synth:tiny --kv-tokens 99999999999", "error: --kv-tokens: 99999999999 is out of range: it must be 0 to 1073741824"},
      {"serve -m synth:tiny --max-queue 3000000000", "error: --max-queue: 3000000000 is out of range: it must be at most 2147483647"},
  };
  for (const auto& [args, want] : cases) {
    Result r = cli(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_TRUE(has(r.err, want)) << args << ": " << r.err;
    EXPECT_FALSE(has(r.err, "Could not convert")) << args << ": " << r.err;
  }
  // compile refuses a context past the model's training context, as run and serve do (it accepted it)
  Result ctx = cli("compile -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf --emit program -c 99999");
  EXPECT_EQ(ctx.status, 1) << ctx.err;
  EXPECT_TRUE(has(ctx.err, "error: context length 99999 exceeds the model's training context 2048")) << ctx.err;
  // The limits themselves are accepted: a seed of 2^64-1, top-p 1, temp 0.
  Result a = cli(run + "--seed 18446744073709551615 --top-p 1 --temp 0");
  EXPECT_EQ(a.status, 0) << a.err;
  Result b = cli(run + "--seed 0 --top-p 0.5 --temp 1.5 --top-k 0");
  EXPECT_EQ(b.status, 0) << b.err;
  Result c = cli(run + "--top-p 1e-40 --temp 1e38");  // tiny and huge but still in range as floats
  EXPECT_EQ(c.status, 0) << c.err;
}

// An unknown or missing command is named with the list of commands (not CLI11's "A subcommand is
// required"); an option given twice says so (not "At Most 1 required but received 2"), exit 2.
TEST(E2ECliUsage, UnknownCommandAndRepeatedOptionAreNamed) {
  const std::string commands = "run, info, logits, embed, compile, bench-copy, tokenize, chat, serve";
  Result r = cli("bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: unknown command 'bogus'; the commands are: " + commands)) << r.err;
  r = cli("--bad-flag bogus -m x");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: unknown command 'bogus'")) << r.err;
  r = cli("");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: a command is required: " + commands)) << r.err;
  r = cli("-v");  // an option before any command is named (it said only "a command is required")
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: unknown option '-v' (before a command only --help and --version); a command is required: " +
                         commands)) << r.err;
  for (const std::string args : {"run -m synth:tiny --ids 1 -n 1 --temp 0 --temp 0", "chat -m synth:tiny --temp 0 --temp 1",
                                  "logits -m synth:tiny --ids 1 --ids 2"}) {
    r = cli(args);
    EXPECT_EQ(r.status, 2) << args;
    const std::string opt = has(args, "--ids 2") ? "--ids" : "--temp";
    EXPECT_TRUE(has(r.err, "error: " + opt + " was given 2 times; give it once")) << args << ": " << r.err;
    EXPECT_FALSE(has(r.err, "At Most")) << r.err;
  }
  // An option at the end without its value (CLI11: "--n-predict: 1 required INT:INT>=0 missing").
  r = cli("run -m synth:tiny --ids 1 -n");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: --n-predict needs a value (see --help)")) << r.err;
  // An error inside a command keeps CLI11's words where they name the cause.
  r = cli("run -m synth:tiny --ids 1 extra");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: unexpected argument: 'extra'")) << r.err;
  // An unknown option is named first, even when a required option is missing too, and extra
  // arguments are listed in the order given (CLI11 reported "--model is required" here, and listed
  // them last to first).
  r = cli("run --tmp 0");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: unknown option '--tmp' for 'run' (unexpected: '--tmp', '0')")) << r.err;
  r = cli("chat -m synth:tiny --bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(has(r.err, "error: unknown option '--bogus' for 'chat' (see --help)")) << r.err;
}

// An unknown --backend is a usage error of every command that takes one, named with the list, before
// the model is read (the model here does not exist).
TEST(E2ECliUsage, UnknownBackendIsAUsageError) {
  for (const std::string cmd : {"run -m /nonexistent.gguf -p hi", "chat -m /nonexistent.gguf", "logits -m /nonexistent.gguf --ids 1",
                                "serve -m /nonexistent.gguf"}) {
    Result r = cli(cmd + " --backend nosuch");
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.err;
    EXPECT_TRUE(has(r.err, "error: --backend: unknown backend 'nosuch'; available: cpu, reference")) << cmd << ": " << r.err;
  }
}

// So is an unknown --schedule (it was a runtime error, exit 1), in every command that takes one.
TEST(E2ECliUsage, UnknownScheduleIsAUsageError) {
  for (const std::string cmd : {"run -m /nonexistent.gguf -p hi", "logits -m /nonexistent.gguf --ids 1", "serve -m /nonexistent.gguf",
                                "compile -m /nonexistent.gguf"}) {
    Result r = cli(cmd + " --schedule nosuch");
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.err;
    EXPECT_TRUE(has(r.err, "error: --schedule: unknown schedule 'nosuch' (expected dynamic, static-rr or static-cp)")) << cmd << ": " << r.err;
  }
}

// serve: a KV pool or buffers too large to allocate name the options that size them. A KV cache
// larger than the machine's memory is refused from the model's shapes, before any weight is built:
// 2^30 rows of stories260k (5 layers x 2 x 4 KV heads x 8) are at least 640 GiB at 2 bytes; 65536 x
// 4096 rows of the 8B shape (32 layers x 2 x 8 x 128) 32 TiB, whose 16 GB of synthetic weights took
// 49 s to build before the allocation failed (new-user trial).
TEST(E2ECliUsage, ServeThatCannotAllocateNamesTheOptionsToLower) {
  Result r = cli("serve -m synth:stories260k --port 0 --parallel 65536 --kv-tokens 1073741824");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_TRUE(has(r.err, "lower --parallel, -c or --kv-tokens")) << r.err;
  EXPECT_TRUE(has(r.err, "--parallel 65536")) << r.err;
  EXPECT_TRUE(has(r.err, "cannot allocate the KV cache: 1073741824 rows x 5 layers x 4 KV heads x 8 need at least 640.0 GiB"))
      << r.err;
  // The default pool holds one context per request that can run at once: 256 (a step's rows) of them,
  // 128 GiB at the 8B shape's 4096 positions (a machine with more memory would try to allocate it).
  if (sysconf(_SC_PHYS_PAGES) * static_cast<double>(sysconf(_SC_PAGE_SIZE)) < 100e9) {
    r = cli("serve -m synth:llama3.1-8b --backend cpu --port 0 --parallel 65536");
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_TRUE(has(r.err, "cannot allocate the KV cache: 1048576 rows x 32 layers x 8 KV heads x 128 need at least "
                           "128.0 GiB"))
        << r.err;
    EXPECT_TRUE(has(r.err, "--parallel 65536, -c 0")) << r.err;
  }
}

// A server that could serve nothing, or that anyone could use by mistake, does not start.
TEST(E2ECliUsage, ServeRefusesAnEmptyApiKeyAndAOnePositionContext) {
  Result r = cli("serve -m synth:tiny --port 0 --api-key \"\"");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--api-key: must not be empty")) << r.err;
  r = cli("serve -m synth:tiny --port 0 -c 1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_TRUE(has(r.err, "error: -c 1: a context of one position leaves no room to serve a request")) << r.err;
}

// Byte tokens (stories260K's SentencePiece vocabulary spells "日本" as six <0xNN> tokens) are parts of
// characters: `tokenize` shows their bytes as \xNN, and --json gives every piece's bytes, which
// concatenate to the text (the "pieces" strings carry U+FFFD there).
TEST(E2ECliUsage, TokenizeShowsTheBytesOfPartialCharacters) {
  Result r = cli("tokenize -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf --no-bos -p \"日本 a\\\\\"");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "-> \"\\xe6\"\n")) << r.out;
  EXPECT_TRUE(has(r.out, "-> \"\\xac\"\n")) << r.out;
  EXPECT_FALSE(has(r.out, "\xef\xbf\xbd")) << r.out;  // no U+FFFD in the listing
  r = cli("tokenize -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf --no-bos --json -p \"日本 a\\\\\"");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  std::string text;
  for (const auto& piece : j.at("piece_bytes"))
    for (int b : piece) text += static_cast<char>(b);
  EXPECT_EQ(j.at("ids").size(), j.at("piece_bytes").size());
  EXPECT_EQ(text, " 日本 a\\");  // SentencePiece's leading space
  // DEL is escaped as the C0 controls are (it printed raw, so its piece looked empty; trial 36)
  r = cli("tokenize -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf --no-bos -p \"$(printf 'b\\177\\001')\"");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "-> \"\\u007f\"\n")) << r.out;
  EXPECT_TRUE(has(r.out, "-> \"\\u0001\"\n")) << r.out;
}

// A SentencePiece vocabulary takes a prompt that is not UTF-8 (its bytes become byte tokens); `run
// --json` then writes the prompt's bytes as U+FFFD in "rendered" (it aborted on an uncaught
// nlohmann type_error, exit 134).
TEST(E2ECliUsage, RunJsonWithAPromptThatIsNotUtf8) {
  Result r = cli("run -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf -p \"$(printf 'caf\\351 \\377')\" -n 3 --temp 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("rendered").get<std::string>(), "caf\xef\xbf\xbd \xef\xbf\xbd");
  EXPECT_EQ(j.at("generated_ids").size(), 3u);
}

// synth: models are random weights with no vocabulary: `tokenize` says so (as `run -p` does).
TEST(E2ECliUsage, TokenizeRefusesSyntheticModels) {
  Result r = cli("tokenize -m synth:stories260k -p hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "error: synth:stories260k: synthetic models carry no tokenizer")) << r.err;
  EXPECT_FALSE(has(r.err, "cannot open")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// A -z tokenizer with fewer tokens than the model's vocabulary is allowed (padded embeddings), but named
// in a warning: it may belong to another model (it was taken without a word).
TEST(E2ECliUsage, SmallerTokenizerGivenWithZIsNamed) {
  const std::string tok = MK_SHARED_DIR "/fixtures/bugs/tokenizer_nfc.json";
  Result r = cli("run -m synth:stories15m -z " + tok + " --ids 1,2 -n 2 --temp 0 -t 2");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: -z " + tok + ": the tokenizer has 512 tokens, the model's vocabulary 32000; ids "
                         "from 512 on print as nothing")) << r.err;
  // Its own tokenizer, the same size as the model's vocabulary: no warning.
  r = cli("run -m " MK_SHARED_DIR "/models/stories260K/stories260K.bin -z " MK_SHARED_DIR
          "/models/stories260K/tok512.bin -p Once -n 2 --temp 0");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(has(r.err, "warning")) << r.err;
}

// The oracle computes attention in one pass: a split count other than 1 is refused, not ignored
// (exit 2, a usage error, as CLI11's own option conflicts; new-user trial 45).
TEST(E2ECliUsage, ReferenceBackendRefusesAttnSplits) {
  Result r = cli("logits -m synth:tiny --ids 1,2,3 --backend reference --attn-splits 4");
  EXPECT_EQ(r.status, 2);  // options that cannot work together: a usage error
  EXPECT_TRUE(has(r.err, "error: --attn-splits 4: the reference backend computes attention in one pass")) << r.err;
  r = cli("run -m synth:tiny --ids 1,2 -n 1 --backend reference --attn-splits 0");
  EXPECT_EQ(r.status, 2);  // options that cannot work together: a usage error
  EXPECT_TRUE(has(r.err, "--attn-splits 0: the reference backend")) << r.err;
  r = cli("logits -m synth:tiny --ids 1,2,3 --backend reference --attn-splits 1");
  EXPECT_EQ(r.status, 0) << r.err;
  // Nor does it have a megakernel schedule (a static one was accepted and ignored).
  r = cli("run -m synth:tiny --ids 1,2 -n 1 --backend reference --schedule static-rr");
  EXPECT_EQ(r.status, 2);  // options that cannot work together: a usage error
  EXPECT_TRUE(has(r.err, "error: --schedule static-rr: the reference backend runs op by op")) << r.err;
  r = cli("run -m synth:tiny --ids 1,2 -n 1 --backend reference --schedule dynamic");
  EXPECT_EQ(r.status, 0) << r.err;
  // Nor workers: -t was accepted and ignored (trial 31 leftover); -t 0 (all cores, the default) stays.
  r = cli("run -m synth:tiny --ids 1,2 -n 1 --backend reference -t 4");
  EXPECT_EQ(r.status, 2);  // options that cannot work together: a usage error
  EXPECT_TRUE(has(r.err, "error: -t 4: the reference backend runs op by op on one thread")) << r.err;
  r = cli("logits -m synth:tiny --ids 1,2,3 --backend reference -t 0");
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST(E2ECliUsage, SyntheticPathWithEmptyTypeIsAnError) {
  Result r = cli("info -m synth:stories260k:");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "error: synth:stories260k:: no type after the ':'")) << r.err;
  for (const char* type : {"f32", "f16", "bf16", "q4_0", "q8_0", "q4_K", "q6_K"})
    EXPECT_TRUE(has(r.err, type)) << "the types are listed: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  // The default named is that model's: f32 for the small ones, bf16 for the real llama3 shapes.
  EXPECT_TRUE(has(r.err, "without ':<type>' the weights are f32)")) << r.err;
  EXPECT_TRUE(has(cli("info -m synth:llama3.2-1b:").err, "without ':<type>' the weights are bf16)"));
  r = cli("info -m synth:stories260k:q9");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "unknown dtype 'q9'")) << r.err;
}

// stories260k is 64 wide: K-quant rows (256-element super-blocks) do not fit; the note names the
// tensors that fell back and why. Types whose blocks fit say nothing.
TEST(E2ECliUsage, SyntheticKQuantFallbackIsNamed) {
  Result r = cli("info -m synth:stories260k:q4_K");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "note: synth:stories260k:q4_K: q4_K needs rows that are a multiple of 256 elements")) << r.err;
  EXPECT_TRUE(has(r.err, "blk.*.attn_q.weight (rows of 64: q8_0)")) << r.err;
  EXPECT_TRUE(has(r.err, "token_embd.weight (rows of 64: q8_0)")) << r.err;
  EXPECT_TRUE(has(r.err, "blk.*.ffn_down.weight (rows of 172: f32)")) << r.err;  // 172 is no multiple of 32
  EXPECT_FALSE(has(r.err, "blk.0.")) << "one entry per name, not per layer: " << r.err;
  EXPECT_TRUE(has(r.out, "blk.3.attn_q.weight")) << r.out;
  r = cli("info -m synth:stories260k:q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "blk.*.ffn_down.weight (rows of 172: f32)")) << r.err;
  EXPECT_FALSE(has(r.err, "attn_q")) << r.err;
  r = cli("info -m synth:stories260k");
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(E2ECliUsage, InfoLabelsSyntheticModels) {
  Result r = cli("info -m synth:tiny");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "model:        synth:tiny (synthetic: random weights, no tokenizer)")) << r.out;
  EXPECT_FALSE(has(r.out, "(gguf)")) << r.out;
  r = cli("info -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "stories260K.gguf (gguf)")) << r.out;
}

// `info` lists the file's tensors: those made at load (GPT-2's transposed copies, Phi-3's q/k/v and
// gate/up row views) are named in one line, not listed or counted (GPT-2 showed 67 tensors and
// 2968320 bytes for a file of 40 and 1637760).
TEST(E2ECliUsage, InfoCountsTheFileTensorsOnly) {
  for (const auto& [dir, n, bytes] : {std::tuple<const char*, int, long>{"gpt2_float32", 40, 1637760},
                                      std::tuple<const char*, int, long>{"phi3_float32", 21, 1391232}}) {
    Result r = cli(std::string("info -m " MK_SHARED_DIR "/fixtures/hf/") + dir);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(has(r.out, "\n" + std::to_string(n) + " tensors:\n")) << dir << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "total: " + std::to_string(bytes) + " bytes of weights")) << dir << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "made from these at load, not listed or counted")) << dir << "\n" << r.out;
    EXPECT_FALSE(has(r.out, "q_proj.weight")) << dir << "\n" << r.out;  // a view / transposed copy
  }
  Result r = cli("info -m " MK_SHARED_DIR "/fixtures/hf/llama_gqa_float32");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\n30 tensors:\n")) << r.out;
  EXPECT_FALSE(has(r.out, "made from these at load")) << r.out;
}

// --act-quant / --kv-type auto: on for block-quantized weights in GGUF form, which synthetic
// models share (synth:<name>:q4_1 runs as --act-quant on --kv-type f16, bit for bit), off for
// float weights; the help says so.
TEST(E2ECliUsage, KvTypeHelpSaysWhatAutoPicks) {
  for (const char* cmd : {"run", "chat", "logits"}) {
    Result r = cli(std::string(cmd) + " --help");
    EXPECT_EQ(r.status, 0);
    EXPECT_TRUE(has(r.out, "auto (f16 for GGUF files and synth: models with block-quantized weights, else f32)"))
        << cmd << ": " << r.out;
    EXPECT_TRUE(has(r.out, "auto (on for GGUF files and synth: models with block-quantized weights), on, off"))
        << cmd << ": " << r.out;
  }
  auto logits = [](const std::string& model, const std::string& flags) {
    Result r = cli("logits -m " + model + " --ids 1,2,3 -t 2 " + flags);
    EXPECT_EQ(r.status, 0) << model << " " << flags << ": " << r.err;
    return r.out;
  };
  const std::string q = "synth:stories260k:q4_1";
  EXPECT_EQ(logits(q, ""), logits(q, "--act-quant on --kv-type f16"));
  EXPECT_NE(logits(q, ""), logits(q, "--act-quant off --kv-type f32"));
  EXPECT_NE(logits(q, ""), logits(q, "--act-quant on --kv-type f32"));  // the KV type alone shows
  EXPECT_EQ(logits("synth:stories260k", ""), logits("synth:stories260k", "--act-quant off --kv-type f32"));
  EXPECT_EQ(logits("synth:stories260k:bf16", ""), logits("synth:stories260k:bf16", "--kv-type f32"));
}

// stories260K.gguf with tokenizer.ggml.model "llama" changed to "llamx": the tokenizer is there but
// unusable. A text prompt, `tokenize` and `chat` refuse it with the same words; `run --ids` goes on
// with ids only and warns.
TEST(E2ECliUsage, DamagedTokenizerIsAnErrorForTextAndAWarningForIds) {
  std::ifstream in(MK_SHARED_DIR "/models/stories260K/stories260K.gguf", std::ios::binary);
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  const size_t key = bytes.find("tokenizer.ggml.model");
  ASSERT_NE(key, std::string::npos);
  const size_t value = bytes.find("llama", key + 20);
  ASSERT_LT(value - key, 40u);
  bytes.replace(value, 5, "llamx");
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "mk_damaged_tokenizer.gguf").string();
  std::ofstream(path, std::ios::binary) << bytes;
  const std::string why = "tokenizer model \"llamx\" is not supported";

  for (const std::string& args : {"run -m " + path + " -p Once -n 2", "tokenize -m " + path + " -p Once",
                                  "run -m " + path + " --chat -p Hi -n 2", "chat -m " + path}) {
    Result r = cli(args + " </dev/null");
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_TRUE(has(r.err, "error: " + path + ": " + why)) << args << ": " << r.err;
  }
  // serve goes on for prompts of ids, but names the damage where text would need the tokenizer
  // (here: a chat template at start; HTTP requests in tests/scripts/serve_openai.py).
  Result served = cli("serve -m " + path + " --port 0 --chat-template-file /dev/null");
  EXPECT_EQ(served.status, 1);
  EXPECT_TRUE(has(served.err, "error: --chat-template-file: the model's tokenizer cannot be used (" + path + ": " + why))
      << served.err;
  EXPECT_TRUE(has(served.err, "), so it cannot chat")) << served.err;
  // info lists the file and names the damage (trial 48: it said nothing), exit 0 (--ids runs)
  Result info = cli("info -m " + path);
  EXPECT_EQ(info.status, 0) << info.err;
  EXPECT_TRUE(has(info.out, "tokenizer:    cannot be used: " + path + ": " + why)) << info.out;
  EXPECT_TRUE(has(info.out, "(text prompts, chat, tokenize and serve's text requests refuse the model; run --ids works)\n")) << info.out;
  EXPECT_FALSE(has(cli("info -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf").out, "tokenizer:"));
  // a llama2.c checkpoint with no tokenizer beside it, which run -p refuses (trial 50)
  const std::string lonely = (std::filesystem::path(::testing::TempDir()) / "mk_lonely" / "model.bin").string();
  std::filesystem::create_directories(std::filesystem::path(lonely).parent_path());
  std::filesystem::copy_file(MK_SHARED_DIR "/models/stories260K/stories260K.bin", lonely, std::filesystem::copy_options::overwrite_existing);
  Result alone = cli("info -m " + lonely);
  EXPECT_EQ(alone.status, 0) << alone.err;
  EXPECT_TRUE(has(alone.out, "tokenizer:    cannot be used: " + lonely + ": llama2.c checkpoints carry no tokenizer; pass one with -z")) << alone.out;
  std::filesystem::remove_all(std::filesystem::path(lonely).parent_path());
  Result r = cli("run -m " + path + " --ids 1,403 -n 2 --temp 0");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: the model's tokenizer cannot be used (" + path + ": " + why)) << r.err;
  EXPECT_TRUE(has(r.err, "); printing token ids only\n")) << r.err;
  // The generated ids, as the intact model gives them for the same prompt.
  Result intact = cli("run -m " MK_SHARED_DIR "/models/stories260K/stories260K.gguf --ids 1,403 -n 2 --temp 0 --json");
  ASSERT_EQ(intact.status, 0) << intact.err;
  const auto j = nlohmann::json::parse(intact.out);
  const auto gen = j["generated_ids"].get<std::vector<int>>();
  ASSERT_EQ(gen.size(), 2u);
  EXPECT_TRUE(j.at("rendered").is_null()) << j.dump();  // a prompt of ids has no text (it said "")
  EXPECT_EQ(j.at("prompt_ids"), nlohmann::json({1, 403}));
  EXPECT_EQ(r.out, std::to_string(gen[0]) + " " + std::to_string(gen[1]) + "\n");
  std::filesystem::remove(path);
}

// Strings read from the file reach the terminal escaped: an OSC sequence as tokenizer.ggml.model
// (in `tokenize`'s error and `run --ids`'s warning) and a clear-screen as general.architecture.
TEST(E2ECliUsage, FileStringsInMessagesAreEscaped) {
  std::ifstream in(MK_SHARED_DIR "/models/stories260K/stories260K.gguf", std::ios::binary);
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string original = ss.str();
  auto damaged = [&](const std::string& key, const std::string& value, const std::string& name) {
    std::string bytes = original;
    const size_t k = bytes.find(key);
    EXPECT_NE(k, std::string::npos);
    const size_t v = bytes.find("llama", k + key.size());
    EXPECT_LT(v - k, key.size() + 20);
    bytes.replace(v, 5, value);
    const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  };
  auto clean = [](const std::string& s) {
    for (char c : s)
      if (c != '\n' && (c < 0x20 || c >= 0x7f)) return false;
    return true;
  };
  const std::string tok = damaged("tokenizer.ggml.model", "\x1b]0;X", "mk_osc_tokenizer.gguf");
  Result r = cli("tokenize -m " + tok + " -p hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "tokenizer model \"\\x1b]0;X\" is not supported")) << r.err;
  EXPECT_TRUE(clean(r.err)) << r.err;
  r = cli("run -m " + tok + " --ids 1,403 -n 1 --temp 0");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: the model's tokenizer cannot be used")) << r.err;
  EXPECT_TRUE(has(r.err, "\\x1b]0;X")) << r.err;
  EXPECT_TRUE(clean(r.err)) << r.err;
  const std::string arch = damaged("general.architecture", "\x1b[2J\xff", "mk_esc_arch.gguf");
  r = cli("info -m " + arch);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "unsupported architecture '\\x1b[2J\\xff'")) << r.err;
  EXPECT_TRUE(clean(r.err)) << r.err;
  std::filesystem::remove(tok);
  std::filesystem::remove(arch);
}

// Options that need or exclude each other beyond what CLI11 states are usage errors too (exit 2, as
// `--ids 1 -p x`), found before the model loads.
TEST(E2ECliUsage, OptionCombinationsAreUsageErrors) {
  const std::string model = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  const std::string messages = (std::filesystem::path(::testing::TempDir()) / "mk_usage_messages.json").string();
  std::ofstream(messages) << R"([{"role": "user", "content": "hi"}])";
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"run -m " + model + " --chat", "error: --chat needs the user's text with -p TEXT (not empty) (see --help)"},
           {"run -m " + model + " --messages " + messages + " -p x", "error: --messages and -p cannot be combined (see --help)"},
           {"run -m " + model + " -p x --chat-template-file " + messages, "error: --chat-template-file needs --chat or --messages"},
           {"tokenize -m " + model, "error: tokenize: give the text with -p TEXT or -f FILE (see --help)"}}) {
    Result r = cli(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_TRUE(has(r.err, want)) << args << ": " << r.err;
  }
  std::filesystem::remove(messages);
}

// A directory where a text file is expected (tokenize -f, --chat-template-file, --messages) is named
// as such (it was read as an empty file: "1 -> <s>", or an error about an empty prompt).
TEST(E2ECliUsage, DirectoryGivenForATextFileIsNamed) {
  const std::string model = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  const std::string dir = ::testing::TempDir();
  for (const std::string& args : {"tokenize -m " + model + " -f " + dir, "run -m " + model + " --chat -p hi --chat-template-file " + dir,
                                  "run -m " + model + " --messages " + dir, "chat -m " + model + " --chat-template-file " + dir}) {
    Result r = cli(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_TRUE(has(r.err, dir + ": is a directory, expected a file")) << args << ": " << r.err;
  }
}

// New-user trial 35: "-" reads standard input for --messages and tokenize -f; a JSON error reads
// without nlohmann's "[json.exception.parse_error.101]" tag; "+1" is a number; "(1 token)".
TEST(E2ECliUsage, StdinPlusSignsAndJsonErrors) {
  const std::string model = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / ("mk_stdin_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string msgs = (dir / "m.json").string(), tmpl = (dir / "t.jinja").string(), text = (dir / "t.txt").string(),
                    bad = (dir / "bad.json").string();
  std::ofstream(msgs) << R"([{"role": "user", "content": "Once upon"}])";
  std::ofstream(tmpl) << "{% for m in messages %}{{ m.content }}{% endfor %}";
  std::ofstream(text) << "Once upon a time";
  std::ofstream(bad) << R"([{"role": "user", "content": "x"},])";
  const std::string run = "run -m " + model + " -n 3 --temp 0 --json --chat-template-file " + tmpl + " --messages ";
  Result from_file = cli(run + msgs);
  Result from_stdin = cli(run + "- < " + msgs);
  ASSERT_EQ(from_file.status, 0) << from_file.err;
  EXPECT_EQ(from_stdin.status, 0) << from_stdin.err;
  const auto a = nlohmann::json::parse(from_file.out), b = nlohmann::json::parse(from_stdin.out);
  EXPECT_EQ(a["rendered"], "Once upon");
  EXPECT_EQ(a["prompt_ids"], b["prompt_ids"]);
  EXPECT_EQ(a["generated_ids"], b["generated_ids"]);
  EXPECT_EQ(a["generated_ids"].size(), 3u);

  Result tok_file = cli("tokenize -m " + model + " -f " + text);
  Result tok_stdin = cli("tokenize -m " + model + " -f - < " + text);
  ASSERT_EQ(tok_file.status, 0) << tok_file.err;
  EXPECT_EQ(tok_stdin.status, 0) << tok_stdin.err;
  EXPECT_EQ(tok_file.out, tok_stdin.out);
  EXPECT_EQ(tok_file.out, cli("tokenize -m " + model + " -p 'Once upon a time'").out);

  for (const std::string& args : {run + bad, run + "- < " + bad}) {
    Result r = cli(args);
    EXPECT_EQ(r.status, 1) << args;
    const std::string source = has(args, "- <") ? "standard input" : bad;
    EXPECT_TRUE(has(r.err, "error: " + source + ": invalid JSON: parse error at line 1, column 35: syntax error while parsing value")) << r.err;
    EXPECT_FALSE(has(r.err, "json.exception")) << r.err;
  }

  // A leading '+' is accepted as strtod and Python take it, for numbers and whole numbers alike.
  Result plus = cli("run -m " + model + " --ids 1,403 -n 2 --temp +0 --top-k +5 --seed +7 -t +1 --json");
  ASSERT_EQ(plus.status, 0) << plus.err;
  EXPECT_EQ(nlohmann::json::parse(plus.out)["generated_ids"],
            nlohmann::json::parse(cli("run -m " + model + " --ids 1,403 -n 2 --temp 0 --top-k 5 --seed 7 -t 1 --json").out)["generated_ids"]);
  EXPECT_TRUE(has(cli("run -m " + model + " --ids 1 --temp ++1").err, "error: --temp: '++1' is not a number"));
  EXPECT_TRUE(has(cli("run -m " + model + " --ids 1 --top-k +-1").err, "error: --top-k: '+-1' is not a whole number"));

  // Leading zeros are decimal (CLI11 read "010" as octal 8 and refused "08"; new-user trial 36)
  for (const auto& [n, want] : {std::pair<std::string, size_t>{"010", 10}, {"08", 8}, {"+009", 9}}) {
    Result z = cli("run -m " + model + " --ids 1 -n " + n + " --ignore-eos --temp 0 --json");
    ASSERT_EQ(z.status, 0) << n << ": " << z.err;
    EXPECT_EQ(nlohmann::json::parse(z.out)["generated_ids"].size(), want) << n;
  }
  Result full = cli("run -m " + model + " --ids 1 -n 4 -c 1");
  EXPECT_EQ(full.status, 0) << full.err;
  EXPECT_TRUE(has(full.err, "note: stopped: the context (1 token) is full\n")) << full.err;
  std::filesystem::remove_all(dir);
}

// New-user trial 35: info exited 0 on files run refuses, and a transposed safetensors tensor was
// named without its model. Here an HF fixture's k_proj declared [96, 32] instead of [32, 96].
TEST(E2ECliUsage, InfoAndRunNameAWrongTensorShape) {
  const std::filesystem::path src = MK_SHARED_DIR "/fixtures/hf/llama_gqa_float32";
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / ("mk_transposed_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "generation_config.json"}) std::filesystem::copy_file(src / f, dir / f);
  std::ifstream in(src / "model.safetensors", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  auto& shape = header.at("model.layers.0.self_attn.k_proj.weight").at("shape");
  ASSERT_EQ(shape, nlohmann::json({32, 96}));
  shape = nlohmann::json({96, 32});
  std::string h = header.dump();
  ASSERT_LE(h.size(), n);
  h.resize(n, ' ');
  bytes.replace(8, n, h);
  std::ofstream(dir / "model.safetensors", std::ios::binary) << bytes;
  const std::string why = dir.string() + ": tensor model.layers.0.self_attn.k_proj.weight has shape [96, 32], expected [32, 96] (transposed?)";
  Result info = cli("info -m " + dir.string());
  EXPECT_EQ(info.status, 1) << info.err;
  EXPECT_TRUE(has(info.out, "graph:        cannot be built: " + why + "\n")) << info.out;
  EXPECT_TRUE(has(info.out, "model.layers.0.self_attn.k_proj.weight")) << info.out;  // the listing is still printed
  EXPECT_EQ(info.err, "error: " + why + " (the model cannot be run; its tensors are listed above)\n");
  Result run = cli("run -m " + dir.string() + " -p hi -n 1");
  EXPECT_EQ(run.status, 1);
  EXPECT_EQ(run.err, "error: " + why + "\n");
  // The intact fixture: exit 0.
  EXPECT_EQ(cli("info -m " + src.string()).status, 0);
  // A config.json key missing is named with the directory (it said "config.json: missing ...")
  auto config = nlohmann::ordered_json::parse(std::ifstream(src / "config.json"));
  config.erase("num_attention_heads");
  std::ofstream(dir / "config.json") << config.dump();
  for (const std::string& cmd : std::vector<std::string>{"info", "run -p hi -n 1 "}) {
    Result r = cli(cmd + " -m " + dir.string());
    EXPECT_EQ(r.status, 1) << cmd;
    EXPECT_EQ(r.err, "error: " + dir.string() + "/config.json: missing num_attention_heads\n") << cmd;
  }
  // Files that are not models: empty, a /proc file (size 0 but text), a device.
  std::ofstream(dir / "empty.gguf").close();
  EXPECT_EQ(cli("info -m " + (dir / "empty.gguf").string()).err, "error: " + (dir / "empty.gguf").string() + ": file is empty\n");
  EXPECT_EQ(cli("info -m /proc/self/status").err,
            "error: /proc/self/status: the file reports size 0 but holds data (a /proc or /sys file?); it cannot be mapped\n");
  EXPECT_EQ(cli("info -m /dev/zero").err, "error: /dev/zero: not a regular file\n");
  std::filesystem::remove_all(dir);
}

// --trace is written after the last step: a path that cannot be written is refused before the
// first step (nothing is generated), naming the path; a path that can gets the trace. The reference
// backend has no trace and says so instead of ignoring the flag.
TEST(E2ECliUsage, TracePathIsCheckedBeforeGenerating) {
  Result r = cli("run -m synth:tiny --ids 1,2 -n 4 --temp 0 -t 2 --trace /nonexistent/dir/t.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "error: --trace: /nonexistent/dir/t.json: cannot open for writing (No such file or directory)"))
      << r.err;
  EXPECT_TRUE(r.out.empty()) << "tokens were generated before the error: " << r.out;
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "mk_trace_check.json").string();
  std::filesystem::remove(path);
  r = cli("run -m synth:tiny --ids 1,2 -n 4 --temp 0 -t 2 --trace " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  std::ifstream in(path);
  std::string head(16, '\0');
  in.read(head.data(), 16);
  EXPECT_EQ(head, "{\"displayTimeUni") << path;
  std::filesystem::remove(path);
  r = cli("run -m synth:tiny --ids 1,2 -n 4 --backend reference --trace " + path);
  EXPECT_EQ(r.status, 2);  // an option conflict: a usage error
  EXPECT_TRUE(has(r.err, "error: --trace: the reference backend has no trace")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path)) << "the check leaves no file behind";
  // A trace that opens but cannot be written (a full disk) is an error, not "wrote /dev/full".
  r = cli("run -m synth:tiny --ids 1,2 -n 4 --temp 0 -t 2 --trace /dev/full");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "error: /dev/full: writing the trace failed (No space left on device)")) << r.err;
  EXPECT_FALSE(has(r.err, "wrote /dev/full")) << r.err;
}

// --host that is no address: the error names the host and port and why, before the model loads
// (cpp-httplib alone says only that binding failed; this once read "no free port").
TEST(E2ECliUsage, ServeRefusesAnEmptyHostOrAlias) {
  for (const char* opt : {"--host", "--alias"}) {
    Result r = cli(std::string("serve -m synth:tiny --port 0 ") + opt + " ''");
    EXPECT_EQ(r.status, 2) << opt << ": " << r.err;
    EXPECT_TRUE(has(r.err, "must not be empty")) << opt << ": " << r.err;
  }
}

TEST(E2ECliUsage, ServeNamesAnAddressItCannotListenOn) {
  Result r = cli("serve -m synth:tiny --host 999.1.1.1 --port 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "error: cannot listen on 999.1.1.1:0: '999.1.1.1' is not a valid address or host name")) << r.err;
  EXPECT_FALSE(has(r.err, "no free port")) << r.err;
  r = cli("serve -m synth:tiny --host 192.0.2.1 --port 8093");  // TEST-NET-1: valid, on no interface here
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "error: cannot listen on 192.0.2.1:8093: 192.0.2.1 is not an address of this machine")) << r.err;
}

}  // namespace

// `run --help` shows the generation defaults the README lists (a new user could not find them).
TEST(E2ECliUsage, RunHelpShowsGenerationDefaults) {
  Result r = cli("run --help");
  EXPECT_EQ(r.status, 0);
  for (const char* want : {"--n-predict INT:INT>=0=256", "--temp FLOAT:NUMBER>=0=0.8", "--top-k INT:INT>=0=40",
                           "(0 - 1]=0.95", "=42", "--repeat-penalty FLOAT:NUMBER in (0 - 1000000]=1"})
    EXPECT_TRUE(has(r.out, want)) << want << "\n" << r.out;
  Result c = cli("chat --help");
  EXPECT_TRUE(has(c.out, "--n-predict INT:INT>=0=1024")) << c.out;
}

// --version prints the version and how the binary was built, exit 0, with or without a command.
TEST(E2ECliUsage, VersionFlag) {
  Result r = cli("--version");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "megakernel 0.1.0 (")) << r.out;
  EXPECT_FALSE(has(r.out, "error")) << r.out;
}

// tokenize reads only the vocabulary of an HF directory too: config.json and tokenizer.json without
// weights, or beside weights it cannot load, give the ids of the whole checkpoint (new-user trial:
// it opened model.safetensors and failed on a missing, empty or I8 one).
TEST(E2ECliUsage, TokenizeAnHfDirectoryReadsNoWeights) {
  const std::filesystem::path fixture = MK_SHARED_DIR "/fixtures/hf/llama_gqa_float32";
  const std::string text = " Hello, world! 123";
  Result whole = cli("tokenize --json -m " + fixture.string() + " -p '" + text + "'");
  ASSERT_EQ(whole.status, 0) << whole.err;
  ASSERT_NE(whole.out.find("\"ids\""), std::string::npos) << whole.out;
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "mk_hf_vocab_only";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json"})
    std::filesystem::copy_file(fixture / f, dir / f);
  Result r = cli("tokenize --json -m " + dir.string() + " -p '" + text + "'");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, whole.out);
  std::ofstream(dir / "model.safetensors", std::ios::binary) << "";  // empty: no model, still a vocabulary
  r = cli("tokenize --json -m " + dir.string() + " -p '" + text + "'");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, whole.out);
  r = cli("run -m " + dir.string() + " -p hi -n 1");  // run needs the weights: the error says so
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

// compile -o prints the program's summary, except for --emit graph, which builds no program (it
// printed "0 instructions per step ... workers 1" whatever -t said).
TEST(E2ECliUsage, CompileToAFileSummarisesTheProgramItBuilt) {
  const std::string out = (std::filesystem::path(::testing::TempDir()) / "mk_compile_summary.txt").string();
  Result r = cli("compile -m synth:tiny --emit program -t 3 -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("wrote " + out + "\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("workers 3"), std::string::npos) << r.err;
  r = cli("compile -m synth:tiny --emit graph -t 3 -o " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "wrote " + out + "\n");
  std::filesystem::remove(out);
}

// run's timing line: with one new token (it comes from the prompt's step) there is no decode rate.
TEST(E2ECliUsage, RunTimingLineWithoutADecodeStep) {
  Result r = cli("run -m synth:tiny --ids 1,2 -n 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("| generation: 1 token, no decode step\n"), std::string::npos) << r.err;
  r = cli("run -m synth:tiny --ids 1,2 -n 3");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("| generation: 3 tokens, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" tokens/s)\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("no decode step"), std::string::npos) << r.err;
}

// `info` names the positional encoding and the attention the graph runs, per group of layers
// (it printed none of RoPE's theta, scaling or the sliding window; trial 31 leftover): Gemma 3's
// local layers rotate with theta 1e4 under a window of 8, its global layer with 1e6; Llama 3.1
// scaling lists its parameters; GPT-2 has learned positions, no RoPE; Gemma 2's soft-caps.
TEST(E2ECliUsage, InfoNamesRopeAndAttention) {
  Result r = cli("info -m \"" + std::string(MK_SOURCE_DIR) + "/tests/data/gemma3/gemma3-tiny.f32.gguf\"");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\nrope:         halves, n_rot 16, theta 10000 (5 of 6 layers); halves, n_rot 16, theta 1e+06 (1 of 6 layers)\n"))
      << r.out;
  EXPECT_TRUE(has(r.out, "\nattention:    scale 0.25, sliding window 8 on 5 of 6 layers\n")) << r.out;
  r = cli("info -m " + std::string(MK_SHARED_DIR) + "/fixtures/hf/llama3_scaled_tied_float32");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\nrope:         halves, n_rot 16, theta 500000, scaling llama3, factor 8, high_freq_factor 4, "
                         "low_freq_factor 1, original_max_pos 64\n"))
      << r.out;
  r = cli("info -m " + std::string(MK_SHARED_DIR) + "/fixtures/hf/gpt2_float32");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\nrope:         none\nattention:    scale 0.25\n")) << r.out;
  r = cli("info -m synth:stories260k");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\nrope:         adjacent, n_rot 8, theta 10000\n")) << r.out;
  EXPECT_FALSE(has(r.out, "soft-capped")) << r.out;
  // Gemma 2: one RoPE for both kinds of layer, every other layer local, both soft-caps.
  r = cli("info -m \"" + std::string(MK_SOURCE_DIR) + "/tests/data/gemma2/hf\"");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\nrope:         halves, n_rot 16, theta 10000\nattention:    scale 0.25, sliding window 8 on 2 of 4 "
                         "layers, scores soft-capped at 2\nembeddings:   scaled by 6.9282\nlogits:       soft-capped at 6\n"))
      << r.out;
}

// `run -j SCHEMA`: the reply is an object of the schema (here enums and a bounded list, so it
// closes within the tokens given) and generation stops when it closes; a schema it cannot take, or
// text that is not JSON, is a usage error before the model loads.
TEST(E2ECliUsage, RunJsonSchemaRepliesWithAnObjectOfIt) {
  const std::string model = MK_SHARED_DIR "/models/stories260K/stories260K.gguf";
  const std::string schema =
      R"('{"type":"object","properties":{"mood":{"enum":["happy","sad"]},"pets":{"type":"array","items":{"enum":["cat","dog"]},"maxItems":2}},"required":["mood","pets"]}')";
  int stopped = 0;
  for (const char* seed : {"1", "2", "3", "4"}) {
    Result r = cli("run -m " + model + " -p 'Once upon a time' -n 120 --temp 1 --seed " + std::string(seed) + " --json -j " + schema);
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const std::string text = j["text"];
    ASSERT_EQ(text.rfind("{", 0), 0u) << text;
    if (j["stop_reason"] != "json") continue;  // 120 tokens of whitespace and the like
    ++stopped;
    const auto obj = nlohmann::json::parse(text);
    EXPECT_TRUE(obj["mood"] == "happy" || obj["mood"] == "sad") << text;
    EXPECT_LE(obj["pets"].size(), 2u) << text;
  }
  EXPECT_GE(stopped, 2);
  Result bad = cli("run -m " + model + " -p x -n 2 -j '{\"type\":\"object\",\"properties\":{\"a\":{\"multipleOf\":2}}}'");
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(has(bad.err, "error: --json-schema: json_schema /properties/a: 'multipleOf' is not supported")) << bad.err;
  bad = cli("run -m " + model + " -p x -n 2 -j '{oops'");
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(has(bad.err, "error: --json-schema is not valid JSON")) << bad.err;
  bad = cli("run -m " + model + " -p x -n 2 -j ''");  // not "no schema" (trial 44)
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(has(bad.err, "error: --json-schema is empty")) << bad.err;
}
