// Reasoning ("thinking") in a chat reply: DeepSeek-R1 and its distills, Qwen3 and QwQ write their
// reasoning between `<think>` and `</think>` before the answer. As llama.cpp's server
// (--reasoning-format deepseek, its default) and vLLM's reasoning parsers, serve returns it apart:
// `message.reasoning_content`, and `delta.reasoning_content` in a stream.
//
// The reasoning begins at a `<think>` that opens the reply (after whitespace), or at the reply's
// start when the prompt ends inside an open `<think>` (templates that open it for the model:
// DeepSeek-R1's); it ends at the first `</think>`; the content is what follows. Whitespace at either
// end of the reasoning and at the start of the content is dropped. A reply cut before `</think>` (max_tokens) is all reasoning. A reply that does not begin
// with `<think>` is all content (a `<think>` later in it stays text).
#pragma once
#include <string>
#include <string_view>

namespace mk {

struct ReasoningParts {
  std::string reasoning, content;
};

// Splits a reply as it streams: feed() each piece, finish() at the end; the parts of all calls
// concatenated equal split_reasoning(whole reply). Text that may still be the start of a tag (or the
// whitespace before the reply's first word) is held until it is known.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool open_at_start) : state_(open_at_start ? State::reasoning : State::start) {}
  ReasoningParts feed(std::string_view piece);
  ReasoningParts finish();
  bool saw_reasoning() const { return state_ != State::start && state_ != State::content_only; }

 private:
  enum class State { start, reasoning, after_close, content, content_only };
  State state_;
  bool lead_ = true;  // at the reasoning's start: whitespace is dropped
  std::string held_;
};

ReasoningParts split_reasoning(std::string_view reply, bool open_at_start);

// Whether a chat template's model reasons in <think> tags (its text names "<think>").
bool template_thinks(std::string_view template_source);
// Whether a rendered prompt leaves a <think> open for the reply (its last "<think>" has no
// "</think>" after it, and only whitespace follows it).
bool prompt_opens_thinking(std::string_view prompt);

}  // namespace mk
