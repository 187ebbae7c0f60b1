// runtime/reasoning.h: <think> reasoning split from a chat reply, whole and as it streams.
#include <gtest/gtest.h>

#include <random>

#include "runtime/reasoning.h"

namespace mk {
namespace {

ReasoningParts split(std::string_view reply, bool open = false) { return split_reasoning(reply, open); }

TEST(Reasoning, SplitsTheThinkBlockThatOpensTheReply) {
  auto p = split("<think>\nThe user greets me.\n</think>\n\nHello!");
  EXPECT_EQ(p.reasoning, "The user greets me.");
  EXPECT_EQ(p.content, "Hello!");
  p = split("  \n<think>a</think>b");  // whitespace before the tag
  EXPECT_EQ(p.reasoning, "a");
  EXPECT_EQ(p.content, "b");
  p = split("<think></think>answer");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "answer");
  p = split("<think>x</think>y</think>z <think>w");  // only the first close ends it; later tags are text
  EXPECT_EQ(p.reasoning, "x");
  EXPECT_EQ(p.content, "y</think>z <think>w");
}

TEST(Reasoning, RepliesWithoutALeadingTagAreContent) {
  for (const char* r : {"Hello <think>no</think>", "  Hi", "", "   ", "<thin", "<think", "<thinking>x</thinking>", "</think>x"}) {
    const auto p = split(r);
    EXPECT_EQ(p.reasoning, "") << r;
    EXPECT_EQ(p.content, r) << r;
  }
}

TEST(Reasoning, OpenAtStartAndCutReplies) {
  auto p = split("Let me think.\n</think>\n\nParis.", /*open=*/true);  // DeepSeek-R1: the template opened it
  EXPECT_EQ(p.reasoning, "Let me think.");
  EXPECT_EQ(p.content, "Paris.");
  p = split("<think>\nstill thinking when max_tokens came  \n");  // never closed: all reasoning
  EXPECT_EQ(p.reasoning, "still thinking when max_tokens came");
  EXPECT_EQ(p.content, "");
  p = split("<think>a</thi");  // cut inside the closing tag
  EXPECT_EQ(p.reasoning, "a</thi");
  p = split("<think>a</think>   ");
  EXPECT_EQ(p.reasoning, "a");
  EXPECT_EQ(p.content, "");
}

TEST(Reasoning, StreamedPiecesAddUpToTheWholeSplit) {
  const std::vector<std::pair<std::string, bool>> replies = {
      {"<think>\nThe user greets me. 2 < 3 and </b> is not it.\n</think>\n\nHello! <think> stays.", false},
      {"  <think>  x  </think>  y  ", false},
      {"Hello <think>", false},
      {"<thi", false},
      {"reasoning </thin k> more\n</think>\nAnswer", true},
      {"never closed  ", true},
      {"<think></think>", false}};
  std::mt19937 rng(7);
  for (const auto& [reply, open] : replies) {
    const ReasoningParts whole = split(reply, open);
    for (int trial = 0; trial < 200; ++trial) {
      ReasoningSplitter s(open);
      ReasoningParts got;
      for (size_t at = 0; at < reply.size();) {
        const size_t n = std::min<size_t>(reply.size() - at, 1 + rng() % 4);
        const auto p = s.feed(std::string_view(reply).substr(at, n));
        got.reasoning += p.reasoning;
        got.content += p.content;
        // nothing of a tag, or of the whitespace the split drops, goes out early
        EXPECT_EQ(whole.reasoning.substr(0, got.reasoning.size()), got.reasoning) << reply;
        EXPECT_EQ(whole.content.substr(0, got.content.size()), got.content) << reply;
        at += n;
      }
      const auto p = s.finish();
      EXPECT_EQ(got.reasoning + p.reasoning, whole.reasoning) << reply;
      EXPECT_EQ(got.content + p.content, whole.content) << reply;
    }
  }
  // the reasoning streams as it comes, not only at its end
  ReasoningSplitter s(false);
  EXPECT_EQ(s.feed("<think>Step one").reasoning, "Step one");
  EXPECT_TRUE(s.saw_reasoning());
  EXPECT_EQ(s.feed(", step two</th").reasoning, ", step two");
  const auto p = s.feed("ink>Done");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "Done");
}

TEST(Reasoning, TemplatesAndPromptsThatThink) {
  EXPECT_TRUE(template_thinks("{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"));
  EXPECT_FALSE(template_thinks("<|im_start|>assistant\n"));
  EXPECT_TRUE(prompt_opens_thinking("<｜Assistant｜><think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));  // Qwen3, enable_thinking false
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_thinking("<think>\nx"));
}

}  // namespace
}  // namespace mk
