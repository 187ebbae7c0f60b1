#include "runtime/json_prefix.h"

namespace mk {

namespace {
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

bool JsonObjectPrefix::feed(uint8_t c) {
  const JsonObjectPrefix saved = *this;
  if (step(c)) return true;
  *this = saved;
  return false;
}

bool JsonObjectPrefix::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!step(static_cast<uint8_t>(c))) return false;
  return true;
}

bool JsonObjectPrefix::structural() const {
  switch (s_) {
    case S::value: case S::obj_first: case S::obj_key: case S::colon: case S::obj_next: case S::arr_first:
    case S::arr_next:
      return true;
    default:
      return false;
  }
}

// json.gbnf's ws: "" | " " | "\n" [ \t]{0,20}, between the tokens of the structure.
bool JsonObjectPrefix::whitespace(uint8_t c) {
  if (c == ' ' || c == '\t') {
    if (ws_ == Ws::newline && indent_ < kMaxIndent) {
      ++indent_;
      return true;
    }
    if (ws_ == Ws::none && c == ' ') {
      ws_ = Ws::space;
      return true;
    }
    return false;
  }
  if (c == '\n' && ws_ == Ws::none) {
    ws_ = Ws::newline;
    indent_ = 0;
    return true;
  }
  return false;
}

void JsonObjectPrefix::value_done() {
  if (depth_ == 0)
    s_ = S::done;
  else
    s_ = (objects_ >> (depth_ - 1)) & 1 ? S::obj_next : S::arr_next;
}

bool JsonObjectPrefix::value(uint8_t c) {
  switch (c) {
    case '{':
    case '[':
      if (depth_ >= kMaxDepth) return false;
      objects_ = (objects_ & ~(uint64_t{1} << depth_)) | (uint64_t{c == '{'} << depth_);
      ++depth_;
      s_ = c == '{' ? S::obj_first : S::arr_first;
      return true;
    case '"':
      key_ = false;
      s_ = S::str;
      return true;
    case '-':
      s_ = S::n_minus;
      return true;
    case '0':
      s_ = S::n_zero;
      return true;
    case 't':
      lit_ = "rue";
      s_ = S::lit;
      return true;
    case 'f':
      lit_ = "alse";
      s_ = S::lit;
      return true;
    case 'n':
      lit_ = "ull";
      s_ = S::lit;
      return true;
    default:
      if (c >= '1' && c <= '9') {
        s_ = S::n_int;
        return true;
      }
      return false;
  }
}

bool JsonObjectPrefix::step(uint8_t c) {
  if (structural()) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return c != '\r' && whitespace(c);
    ws_ = Ws::none;
  }
  switch (s_) {
    case S::start:
      if (c != '{') return false;  // the reply is an object, from its first byte
      return value(c);
    case S::value:
      return value(c);
    case S::obj_first:
      if (c == '}') {
        --depth_;
        value_done();
        return true;
      }
      [[fallthrough]];
    case S::obj_key:
      if (c != '"') return false;
      key_ = true;
      s_ = S::str;
      return true;
    case S::colon:
      if (c != ':') return false;
      s_ = S::value;
      return true;
    case S::obj_next:
      if (c == ',') {
        s_ = S::obj_key;
        return true;
      }
      if (c != '}') return false;
      --depth_;
      value_done();
      return true;
    case S::arr_first:
      if (c == ']') {
        --depth_;
        value_done();
        return true;
      }
      return value(c);
    case S::arr_next:
      if (c == ',') {
        s_ = S::value;
        return true;
      }
      if (c != ']') return false;
      --depth_;
      value_done();
      return true;
    case S::str:
      if (c == '"') {
        if (key_)
          s_ = S::colon;
        else
          value_done();
        return true;
      }
      if (c == '\\') {
        s_ = S::str_esc;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // UTF-8 lead bytes (RFC 3629 table): the range of the first continuation byte, then 80..BF.
      lo_ = 0x80;
      hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        left_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        left_ = 2;
        if (c == 0xE0) lo_ = 0xA0;
        if (c == 0xED) hi_ = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        left_ = 3;
        if (c == 0xF0) lo_ = 0x90;
        if (c == 0xF4) hi_ = 0x8F;
      } else {
        return false;
      }
      s_ = S::str_utf8;
      return true;
    case S::str_utf8:
      if (c < lo_ || c > hi_) return false;
      lo_ = 0x80;
      hi_ = 0xBF;
      if (--left_ == 0) s_ = S::str;
      return true;
    case S::str_esc:
      if (c == 'u') {
        left_ = 4;
        s_ = S::str_u;
        return true;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      s_ = S::str;
      return true;
    case S::str_u:
      if (!is_hex(c)) return false;
      if (--left_ == 0) s_ = S::str;
      return true;
    case S::lit:
      if (c != static_cast<uint8_t>(*lit_)) return false;
      if (*++lit_ == 0) value_done();
      return true;
    case S::n_minus:
      if (c == '0') {
        s_ = S::n_zero;
        return true;
      }
      if (!is_digit(c)) return false;
      s_ = S::n_int;
      return true;
    case S::n_dot:
    case S::n_esign:
      if (!is_digit(c)) return false;
      s_ = s_ == S::n_dot ? S::n_frac : S::n_exp;
      return true;
    case S::n_e:
      if (c == '+' || c == '-') {
        s_ = S::n_esign;
        return true;
      }
      if (!is_digit(c)) return false;
      s_ = S::n_exp;
      return true;
    case S::n_int:
    case S::n_frac:
    case S::n_exp:
      if (is_digit(c)) return true;
      [[fallthrough]];
    case S::n_zero:
      if (c == '.' && (s_ == S::n_zero || s_ == S::n_int)) {
        s_ = S::n_dot;
        return true;
      }
      if ((c == 'e' || c == 'E') && s_ != S::n_exp) {
        s_ = S::n_e;
        return true;
      }
      // The number ends here: the byte belongs to what follows it.
      value_done();
      if (s_ == S::done) return false;  // (a number is never the top-level value)
      return step(c);
    case S::done:
      return false;
  }
  return false;
}

int64_t JsonTokenMask::allowed(const JsonObjectPrefix& prefix, std::vector<uint8_t>& allowed) const {
  allowed.assign(bytes_.size(), 0);
  int64_t n = 0;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& b = bytes_[id];
    if (b.empty()) continue;
    JsonObjectPrefix p = prefix;
    if (p.feed(b)) {
      allowed[id] = 1;
      ++n;
    }
  }
  return n;
}

}  // namespace mk
