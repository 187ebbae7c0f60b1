#include "runtime/reasoning.h"

#include <algorithm>

namespace mk {

namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Length of the longest suffix of s that is a proper prefix of tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

ReasoningParts ReasoningSplitter::feed(std::string_view piece) {
  ReasoningParts out;
  held_.append(piece);
  for (;;) {
    switch (state_) {
      case State::start: {  // whitespace, then "<think>" or anything else
        const size_t word = held_.find_first_not_of(" \t\n\r");
        if (word == std::string::npos) return out;
        const std::string_view rest = std::string_view(held_).substr(word);
        if (rest.substr(0, kOpen.size()) == kOpen) {
          held_.erase(0, word + kOpen.size());
          state_ = State::reasoning;
          continue;
        }
        if (kOpen.substr(0, rest.size()) == rest) return out;  // "<thi": may still be the tag
        state_ = State::content_only;
        continue;
      }
      case State::reasoning: {  // whitespace around the reasoning is dropped (held until text follows it)
        if (lead_) {
          const size_t word = held_.find_first_not_of(" \t\n\r");
          held_.erase(0, word == std::string::npos ? held_.size() : word);
          if (held_.empty()) return out;
          lead_ = false;
        }
        const size_t close = held_.find(kClose);
        if (close != std::string::npos) {
          size_t end = close;
          while (end > 0 && is_space(held_[end - 1])) --end;
          out.reasoning.append(held_, 0, end);
          held_.erase(0, close + kClose.size());
          state_ = State::after_close;
          continue;
        }
        size_t keep = partial_tag(held_, kClose);
        while (keep < held_.size() && is_space(held_[held_.size() - keep - 1])) ++keep;
        out.reasoning.append(held_, 0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      case State::after_close: {
        size_t i = 0;
        while (i < held_.size() && is_space(held_[i])) ++i;
        held_.erase(0, i);
        if (held_.empty()) return out;
        state_ = State::content;
        continue;
      }
      case State::content:
      case State::content_only:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

ReasoningParts ReasoningSplitter::finish() {
  ReasoningParts out;
  if (state_ == State::reasoning) {
    out.reasoning = std::move(held_);
    while (!out.reasoning.empty() && is_space(out.reasoning.back())) out.reasoning.pop_back();
  }
  else if (state_ != State::after_close) out.content = std::move(held_);  // start: whitespace or "<thi" is content
  held_.clear();
  return out;
}

ReasoningParts split_reasoning(std::string_view reply, bool open_at_start) {
  ReasoningSplitter s(open_at_start);
  ReasoningParts a = s.feed(reply), b = s.finish();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

bool template_thinks(std::string_view template_source) { return template_source.find(kOpen) != std::string_view::npos; }

bool prompt_opens_thinking(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string_view::npos) return false;
  const std::string_view after = prompt.substr(open + kOpen.size());
  return std::all_of(after.begin(), after.end(), is_space);
}

}  // namespace mk
