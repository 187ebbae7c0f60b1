// Prompt lookup decoding (runtime/lookup.h; GenerateOptions::draft): the drafts, and generation with
// them giving the same tokens as without on every backend with a paged KV cache (cpu, cuda-emu):
// stories260K's llama2.c greedy references, a prompt the model copies from (drafts accepted), the
// context's end (drafts never run past it), and sampled requests (the same tokens for a seed).
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "runtime/lookup.h"
#include "runtime/session.h"
#include "support/cli.h"

namespace mk {
namespace {

TEST(Lookup, DraftsFollowTheLatestEarlierNgram) {
  const std::vector<int32_t> h = {1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3};
  // last 3 tokens (1 2 3): latest earlier occurrence at 4, followed by 7 8 5 1 ...
  EXPECT_EQ(lookup_draft(h, 2, 4, 3), (std::vector<int32_t>{7, 8, 5}));
  EXPECT_EQ(lookup_draft(h, 2, 4, 10), (std::vector<int32_t>{7, 8, 5, 1, 2, 3}));  // to the end of the history
  EXPECT_EQ(lookup_draft(h, 2, 4, 0), (std::vector<int32_t>{}));
  // the longest n-gram wins: (9 1 2 3) is not earlier, (1 2 3) is
  EXPECT_EQ(lookup_draft(std::vector<int32_t>{5, 6, 1, 2, 4, 2, 6, 1, 2}, 1, 3, 2), (std::vector<int32_t>{4, 2}));
  EXPECT_EQ(lookup_draft(std::vector<int32_t>{5, 6, 1, 2, 4, 2, 6, 1, 2}, 1, 1, 2), (std::vector<int32_t>{6, 1}));  // 1-grams only: "2" at 5 is the latest
  EXPECT_EQ(lookup_draft(std::vector<int32_t>{1, 2, 3, 4}, 1, 4, 4), (std::vector<int32_t>{}));  // nothing recurs
  EXPECT_EQ(lookup_draft(std::vector<int32_t>{7, 7, 7}, 2, 4, 4), (std::vector<int32_t>{7}));     // overlapping: 7 7 -> 7
  EXPECT_EQ(lookup_draft(std::vector<int32_t>{3, 4, 9, 4}, 2, 4, 4), (std::vector<int32_t>{}));   // only a 1-gram recurs
  EXPECT_EQ(lookup_draft(std::vector<int32_t>{}, 1, 4, 4), (std::vector<int32_t>{}));
  EXPECT_EQ(lookup_draft(std::vector<int32_t>{4}, 1, 4, 4), (std::vector<int32_t>{}));
}

TEST(Lookup, BackoffDraftsLessAfterRefusals) {
  DraftBackoff b;
  EXPECT_EQ(b.limit(8), 8);
  b.record(8, 0);  // refused whole: skip 1 step, then drafts of at most 2
  EXPECT_EQ(b.limit(8), 0);
  EXPECT_EQ(b.limit(8), 2);
  b.record(2, 0);  // again: skip 2
  EXPECT_EQ(b.limit(8), 0);
  EXPECT_EQ(b.limit(8), 0);
  EXPECT_EQ(b.limit(8), 2);
  b.record(2, 2);  // accepted: no skip, 2 + 2 * 2
  EXPECT_EQ(b.limit(8), 6);
  b.record(6, 5);
  EXPECT_EQ(b.limit(8), 8);
  b.record(0, 0);  // no draft made: nothing changes
  EXPECT_EQ(b.limit(8), 8);
  for (int k = 0; k < 10; ++k) b.record(2, 0);  // the skip grows to at most 32
  int skipped = 0;
  while (b.limit(8) == 0) ++skipped;
  EXPECT_EQ(skipped, 32);
}

struct Drafted {
  std::vector<int32_t> ids;
  std::string stop;
  int64_t drafted = 0, accepted = 0;
  std::vector<GeneratedLogprob> logprobs;
};

Drafted generate_ids(const std::string& backend, int64_t n_ctx, const std::vector<int32_t>& prompt, int n_new, int draft,
                     float temp = 0, const std::function<void(GenerateOptions&)>& more = {}) {
  SessionOptions so;
  so.model_path = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  so.backend = backend;
  so.backend_options.threads = 2;
  so.n_ctx = n_ctx;
  Session s(so);
  GenerateOptions g;
  g.prompt_ids = prompt;
  g.n_new = n_new;
  g.draft = draft;
  g.sampler.temperature = temp;
  g.sampler.seed = 5;
  if (more) more(g);
  const GenerateResult r = generate(s, g);
  return {r.generated_ids, r.stop_reason, r.n_drafted, r.n_draft_accepted, r.logprobs};
}

class E2ELookup : public testing::TestWithParam<std::string> {};

TEST_P(E2ELookup, SameTokensAsWithoutDrafts) {
  const nlohmann::json ref = test::stories_reference();
  for (const auto& c : ref) {
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto want = c.at("generated_ids").get<std::vector<int32_t>>();
    for (int draft : {1, 4, 16}) {
      const Drafted r = generate_ids(GetParam(), 320, prompt, static_cast<int>(want.size()), draft);
      EXPECT_EQ(r.ids, want) << "draft " << draft;
    }
  }
  // a long story: the tiny model repeats its phrases ("The cat was very happy."), drafts are
  // accepted (cpu: 69 of 242 on 250 tokens), the tokens are the same
  const auto rep = ref[0].at("prompt_ids").get<std::vector<int32_t>>();
  const Drafted plain = generate_ids(GetParam(), 320, rep, 250, 0);
  const Drafted drafted = generate_ids(GetParam(), 320, rep, 250, 8);
  EXPECT_EQ(drafted.ids, plain.ids);
  EXPECT_GT(drafted.accepted, 20) << drafted.drafted;
  EXPECT_EQ(plain.drafted, 0);
  // to the context's end: drafts stop short of it, the stop is the context's
  const Drafted full = generate_ids(GetParam(), 96, rep, 400, 0), full_drafted = generate_ids(GetParam(), 96, rep, 400, 8);
  EXPECT_EQ(full_drafted.ids, full.ids);
  EXPECT_EQ(full_drafted.stop, "context");
  EXPECT_EQ(full.ids.size(), 96u - rep.size() + 1);
}

// Sampled requests draft too: each row's token is drawn as without drafts (the same random numbers,
// the penalty window holding the tokens before it), so a seed gives the same tokens; drafts are
// accepted where the model copies. Top-k from the backend's candidates (top_k <= kTopK), whole rows
// (top_k 0, logprobs), penalties and biases.
TEST_P(E2ELookup, SampledTokensAreTheSameAsWithoutDrafts) {
  const auto rep = test::stories_reference()[0].at("prompt_ids").get<std::vector<int32_t>>();
  struct Case {
    const char* name;
    float temp;
    std::function<void(GenerateOptions&)> more;
  };
  const std::vector<Case> cases = {
      {"top_k 40", 0.8f, {}},
      {"top_k 0, top_p 0.9", 0.7f, [](GenerateOptions& g) { g.sampler.top_k = 0, g.sampler.top_p = 0.9f; }},
      {"min_p, penalties", 0.9f,
       [](GenerateOptions& g) {
         g.sampler.min_p = 0.05f, g.sampler.repeat_penalty = 1.1f, g.sampler.frequency_penalty = 0.3f;
         g.sampler.presence_penalty = 0.2f, g.sampler.penalty_last_n = 16;
       }},
      {"logit bias, logprobs", 0.5f,
       [](GenerateOptions& g) {
         g.sampler.logit_bias = {{400, 2.5f}, {9, -100.0f}};
         g.logprobs = 3;
       }},
      {"greedy with a penalty", 0.0f, [](GenerateOptions& g) { g.sampler.repeat_penalty = 1.3f; }},
  };
  int64_t accepted = 0;
  for (const Case& c : cases)
    for (uint64_t seed : GetParam() == "cpu" ? std::vector<uint64_t>{1, 2, 3} : std::vector<uint64_t>{1}) {  // cuda-emu: ~6 s a case
      auto with_seed = [&](GenerateOptions& g) {
        g.sampler.seed = seed;
        if (c.more) c.more(g);
      };
      const Drafted plain = generate_ids(GetParam(), 320, rep, 120, 0, c.temp, with_seed);
      const Drafted drafted = generate_ids(GetParam(), 320, rep, 120, 8, c.temp, with_seed);
      EXPECT_EQ(drafted.ids, plain.ids) << c.name << ", seed " << seed;
      EXPECT_EQ(drafted.stop, plain.stop) << c.name << ", seed " << seed;
      EXPECT_GT(drafted.drafted, 0) << c.name << ", seed " << seed;
      EXPECT_EQ(plain.drafted, 0);
      ASSERT_EQ(drafted.logprobs.size(), plain.logprobs.size()) << c.name;
      for (size_t k = 0; k < plain.logprobs.size(); ++k) {
        EXPECT_EQ(drafted.logprobs[k].token.logprob, plain.logprobs[k].token.logprob) << c.name << ", token " << k;
        ASSERT_EQ(drafted.logprobs[k].top.size(), plain.logprobs[k].top.size());
        for (size_t t = 0; t < plain.logprobs[k].top.size(); ++t)
          EXPECT_EQ(drafted.logprobs[k].top[t].id, plain.logprobs[k].top[t].id) << c.name << ", token " << k;
      }
      accepted += drafted.accepted;
    }
  EXPECT_GT(accepted, GetParam() == "cpu" ? 40 : 15);  // measured: 65 of 379 drafted, 24 of 138
}

INSTANTIATE_TEST_SUITE_P(Backends, E2ELookup, testing::Values("cpu", "cuda-emu"),
                         [](const auto& info) { return info.param == "cuda-emu" ? std::string("cuda_emu") : info.param; });

TEST(E2ELookupCli, RunReportsItsDrafts) {
  int status = -1;
  std::string err;
  const std::string model = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  const std::string p = "'Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time'";
  const auto a = nlohmann::json::parse(test::run_cli("run -m " + model + " -p " + p + " -n 80 --temp 0 --json --draft 6", &status, &err));
  ASSERT_EQ(status, 0) << err;
  const auto b = nlohmann::json::parse(test::run_cli("run -m " + model + " -p " + p + " -n 80 --temp 0 --json", &status, &err));
  EXPECT_EQ(a.at("generated_ids"), b.at("generated_ids"));
  EXPECT_GT(a.at("n_drafted").get<int>(), 0);
  EXPECT_FALSE(b.contains("n_drafted"));
  test::run_cli("run -m " + model + " -p " + p + " -n 40 --temp 0 --draft 6", &status, &err);
  EXPECT_NE(err.find("drafted tokens accepted"), std::string::npos) << err;
  test::run_cli("run -m " + model + " -p hi --draft 256", &status, &err);
  EXPECT_EQ(status, 2) << err;
  // sampled: the same tokens for a seed
  const auto sa = nlohmann::json::parse(test::run_cli("run -m " + model + " -p " + p + " -n 80 --temp 0.6 --seed 9 --json --draft 6", &status, &err));
  ASSERT_EQ(status, 0) << err;
  const auto sb = nlohmann::json::parse(test::run_cli("run -m " + model + " -p " + p + " -n 80 --temp 0.6 --seed 9 --json", &status, &err));
  EXPECT_EQ(sa.at("generated_ids"), sb.at("generated_ids"));
  EXPECT_GT(sa.at("n_drafted").get<int>(), 0);
  // drafts that cannot be used are named, not silently dropped
  for (const auto& [flags, why] : std::vector<std::pair<std::string, std::string>>{
           {"-j '{\"type\": \"object\"}'", "a JSON reply is drawn token by token"}}) {
    test::run_cli("run -m " + model + " -p hi -n 2 --draft 4 " + flags, &status, &err);
    EXPECT_EQ(status, 0) << err;
    EXPECT_NE(err.find("note: --draft is off: "), std::string::npos) << flags << ": " << err;
    EXPECT_NE(err.find(why), std::string::npos) << flags << ": " << err;
    EXPECT_EQ(err.find("lookup:"), std::string::npos) << flags << ": " << err;
  }
}

// `chat --draft`: the turns' replies are the same as without (stories260K with a ChatML template;
// each turn drafts from its own prompt and reply).
TEST(E2ELookupCli, ChatRepliesAreTheSame) {
  const std::string tpl = std::string(MK_SOURCE_DIR) + "/tests/chat/templates/chatml.jinja";
  auto chat = [&](int draft) {
    int status = -1;
    const std::string out = test::run_shell(
        "printf 'Once upon a time there was a cat. The cat was happy. The cat\\nThe dog\\n' | " + std::string(MK_CLI_PATH) +
            " chat --temp 0 -n 60 --draft " + std::to_string(draft) + " -m " + std::string(MK_SHARED_DIR) +
            "/models/stories260K/stories260K.gguf --chat-template-file " + tpl + " 2>&1",
        &status);
    EXPECT_EQ(status, 0) << out;
    return out;
  };
  const std::string plain = chat(0);
  EXPECT_GT(plain.size(), 40u);
  EXPECT_EQ(chat(6), plain);
}

// chat drafts from the whole conversation (GenerateOptions::penalty_context, the earlier turns): a
// second turn that goes back to what the first said drafts from it, with the same tokens as without.
TEST(E2ELookupChat, LaterTurnsDraftFromEarlierOnes) {
  SessionOptions so;
  so.model_path = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  so.backend_options.threads = 2;
  so.n_ctx = 512;
  auto turn2 = [&](int draft, bool with_history) {
    Session s(so);
    GenerateOptions g;
    g.sampler.temperature = 0;
    g.n_new = 60;
    g.prompt = "Once upon a time there was a cat. The cat was happy.";
    const GenerateResult first = generate(s, g);
    GenerateOptions g2 = g;
    g2.n_new = 12;
    g2.draft = draft;
    g2.add_bos = false;
    g2.prompt_ids = s.tokenizer->encode(" One day, the cat saw", false, true);
    if (with_history) {
      g2.penalty_context = first.prompt_ids;
      g2.penalty_context.insert(g2.penalty_context.end(), first.generated_ids.begin(), first.generated_ids.end());
    }
    return generate(s, g2);
  };
  const GenerateResult plain = turn2(0, true), drafted = turn2(8, true), alone = turn2(8, false);
  EXPECT_EQ(drafted.generated_ids, plain.generated_ids);
  EXPECT_EQ(alone.generated_ids, plain.generated_ids);
  // measured: 4 of 16 drafted tokens accepted with the first turn, 0 of 7 from the second turn alone
  EXPECT_GT(drafted.n_draft_accepted, alone.n_draft_accepted) << drafted.n_drafted << " " << alone.n_drafted;
  EXPECT_GT(drafted.n_drafted, alone.n_drafted);
}

}  // namespace
}  // namespace mk
