/*
    Copyright 2024 Google LLC

    Use of this source code is governed by an MIT-style
    license that can be found in the LICENSE file or at
    https://opensource.org/licenses/MIT.
*/
// SPDX-License-Identifier: MIT
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <charconv>  // megakernel: python_float_repr
#include <cmath>
#include <exception>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>  // megakernel: slice bounds
#include <regex>
#include <sstream>
#include <string>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <utf8proc.h>  // megakernel: case mapping beyond ASCII

using json = nlohmann::ordered_json;

namespace minja {

class Context;

struct Options {
    bool trim_blocks;  // removes the first newline after a block
    bool lstrip_blocks;  // removes leading whitespace on the line of the block
    bool keep_trailing_newline;  // don't remove last newline
};

struct ArgumentsValue;

// megakernel: resource limits for untrusted templates (a GGUF's chat template, --chat-template-file)
// and untrusted inputs (a client's messages). Each limit ends the render with a LimitError naming
// it; see third_party/minja/README.md.
namespace limits {
constexpr size_t kMaxCallDepth = 256;               // macro calls and recursive loop() calls nested
constexpr size_t kMaxFrames = 2048;                 // evaluate/render calls nested (the C++ stack)
constexpr size_t kMaxParseNesting = 256;            // nested expressions, `not`s, blocks in the source
constexpr size_t kMaxExpressionNodes = 4096;        // nodes of one tag's expression (bounds its depth)
constexpr int64_t kMaxRangeLength = 100000;         // items range() may produce
constexpr size_t kMaxItems = 1000000;               // items of a list made by `+`
constexpr size_t kMaxStringLength = size_t{16} << 20;  // bytes of any string result and of the output
constexpr uint64_t kMaxSteps = 1000000;             // expression evaluations + node renders per render
constexpr size_t kMaxValueNesting = 512;            // lists/dicts nested, for dump, == and get<json>
}  // namespace limits

class LimitError : public std::runtime_error {
 public:
  LimitError(const std::string & what, bool located = false) : std::runtime_error(what), located(located) {}
  bool located;  // the template location was added (only the innermost one is)
};

// megakernel: an error that carries its template location. Only the innermost frame adds one: a
// location per nested frame made messages (and the time to build them) grow with the depth times
// the source line, megabytes for a recursion on a long line.
class LocatedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The budget of the render running on this thread (null outside a render); set by RenderScope.
struct RenderBudget {
  uint64_t steps = 0;
  size_t frames = 0;
  size_t call_depth = 0;
};
inline thread_local RenderBudget * render_budget = nullptr;

// Counts one evaluation or render step and one nested frame for its lifetime.
class FrameGuard {
  RenderBudget * b_;
 public:
  FrameGuard() : b_(render_budget) {
    if (!b_) return;
    if (++b_->steps > limits::kMaxSteps)
      throw LimitError("template limit: more than " + std::to_string(limits::kMaxSteps) + " evaluation steps (an endless or huge loop?)");
    if (++b_->frames > limits::kMaxFrames) {
      --b_->frames;
      throw LimitError("template limit: evaluation nested more than " + std::to_string(limits::kMaxFrames) + " deep");
    }
  }
  ~FrameGuard() { if (b_) --b_->frames; }
  FrameGuard(const FrameGuard &) = delete;
  FrameGuard & operator=(const FrameGuard &) = delete;
};

// One nested macro call or recursive loop() call.
class CallGuard {
  RenderBudget * b_;
 public:
  explicit CallGuard(const std::string & what) : b_(render_budget) {
    if (!b_) return;
    if (++b_->call_depth > limits::kMaxCallDepth) {
      --b_->call_depth;
      throw LimitError("template limit: " + what + " nested more than " + std::to_string(limits::kMaxCallDepth) + " calls deep (endless recursion?)");
    }
  }
  ~CallGuard() { if (b_) --b_->call_depth; }
  CallGuard(const CallGuard &) = delete;
  CallGuard & operator=(const CallGuard &) = delete;
};

// Installs a budget for the outermost render on this thread (a macro's body rendered inside keeps it).
class RenderScope {
  RenderBudget budget_;
  bool outer_;
 public:
  RenderScope() : outer_(render_budget == nullptr) { if (outer_) render_budget = &budget_; }
  ~RenderScope() { if (outer_) render_budget = nullptr; }
  RenderScope(const RenderScope &) = delete;
  RenderScope & operator=(const RenderScope &) = delete;
};

inline void check_string_length(size_t n) {
  if (n > limits::kMaxStringLength)
    throw LimitError("template limit: a string of " + std::to_string(n) + " bytes (at most " + std::to_string(limits::kMaxStringLength) + ")");
}

// Parser nesting and node counts of the parse running on this thread.
struct ParseBudget {
  size_t nesting = 0;
  size_t block_nesting = 0;
  size_t nodes = 0;
};
inline thread_local ParseBudget * parse_budget = nullptr;

class ParseNestingGuard {
  size_t * n_;
 public:
  explicit ParseNestingGuard(bool blocks) : n_(nullptr) {
    if (!parse_budget) return;
    n_ = blocks ? &parse_budget->block_nesting : &parse_budget->nesting;
    if (!blocks && *n_ == 0) parse_budget->nodes = 0;  // a new top-level expression
    if (++*n_ > limits::kMaxParseNesting) {
      --*n_;
      throw LimitError(std::string("template limit: ") + (blocks ? "blocks" : "expressions") + " nested more than " +
                       std::to_string(limits::kMaxParseNesting) + " deep");
    }
  }
  ~ParseNestingGuard() { if (n_) --*n_; }
  ParseNestingGuard(const ParseNestingGuard &) = delete;
  ParseNestingGuard & operator=(const ParseNestingGuard &) = delete;
};

// Bounds the recursion of dump, == and get<json> over nested values (and ends it on a list that
// holds itself).
class ValueNestingGuard {
  static size_t & depth() { static thread_local size_t d = 0; return d; }
 public:
  ValueNestingGuard() {
    if (++depth() > limits::kMaxValueNesting) {
      --depth();
      throw LimitError("template limit: a value nested more than " + std::to_string(limits::kMaxValueNesting) + " deep (a list or dict holding itself?)");
    }
  }
  ~ValueNestingGuard() { --depth(); }
  ValueNestingGuard(const ValueNestingGuard &) = delete;
  ValueNestingGuard & operator=(const ValueNestingGuard &) = delete;
};

inline std::string normalize_newlines(const std::string & s) {
#ifdef _WIN32
  static const std::regex nl_regex("\r\n");
  return std::regex_replace(s, nl_regex, "\n");
#else
  return s;
#endif
}

/* Values that behave roughly like in Python. */
// megakernel: Python's str is a sequence of code points, and so is a string here for indexing,
// slicing, length and iteration (upstream used bytes: `s[0]` rendered empty and a slice could cut a
// UTF-8 character in half). utf8_next gives the byte offset after the code point starting at i; a
// byte that does not begin a well-formed UTF-8 sequence counts as one code point of its own.
inline size_t utf8_next(const std::string & s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (n == 1 || i + n > s.size()) return i + 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return i + 1;
  return i + n;
}
inline int64_t utf8_length(const std::string & s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) ++n;
  return n;
}
// The byte offset where code point `index` (0 <= index <= length) starts.
inline size_t utf8_offset(const std::string & s, int64_t index, size_t from = 0) {
  size_t i = from;
  for (; index > 0 && i < s.size(); --index) i = utf8_next(s, i);
  return i;
}

// megakernel: Python's repr of a float (str() is the same): the shortest digits that read back,
// fixed notation for decimal exponents -4 to 15 with ".0" when whole, else d.ddde+XX; inf, nan.
inline std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);  // "-1.25e+17"
  std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out;
  const int nd = static_cast<int>(digits.size());
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1) + (nd > 1 ? "." + digits.substr(1) : "");
    out += exp < 0 ? "e-" : "e+";
    const std::string ed = std::to_string(exp < 0 ? -exp : exp);
    out += (ed.size() < 2 ? "0" : "") + ed;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (nd <= exp + 1) {
    out = digits + std::string(static_cast<size_t>(exp + 1 - nd), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
  }
  return neg ? "-" + out : out;
}

// megakernel: Python's slice rules (PySlice_AdjustIndices): out-of-range bounds are clamped and
// `None` is an omitted bound, so a slice never reads past the end. Sets the first index and the
// bound (exclusive) a slice of `len` items walks with `step`.
inline void python_slice_bounds(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step,
                                int64_t & first, int64_t & bound) {
  if (step == 0) throw std::runtime_error("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> v, int64_t if_none) -> int64_t {
    if (!v) return if_none;
    int64_t i = *v;
    if (i < 0) {
      i += len;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= len) {
      i = step < 0 ? len - 1 : len;
    }
    return i;
  };
  first = adjust(start, step < 0 ? len - 1 : 0);
  bound = adjust(stop, step < 0 ? -1 : len);
}

class Value : public std::enable_shared_from_this<Value> {
public:
  using CallableType = std::function<Value(const std::shared_ptr<Context> &, ArgumentsValue &)>;
  using FilterType = std::function<Value(const std::shared_ptr<Context> &, ArgumentsValue &)>;

private:
  using ObjectType = nlohmann::ordered_map<json, Value>;  // Only contains primitive keys
  using ArrayType = std::vector<Value>;

  std::shared_ptr<ArrayType> array_;
  std::shared_ptr<ObjectType> object_;
  std::shared_ptr<CallableType> callable_;
  json primitive_;

  Value(const std::shared_ptr<ArrayType> & array) : array_(array) { track(array_); }
  Value(const std::shared_ptr<ObjectType> & object) : object_(object) { track(object_); }
  Value(const std::shared_ptr<CallableType> & callable) : object_(std::make_shared<ObjectType>()), callable_(callable) { track(object_); }

 public:
  // megakernel: the lists and dicts made while a CycleCollector is installed on this thread (weak
  // references; expired ones are dropped whenever the lists double).
  struct Created {
    std::vector<std::weak_ptr<ArrayType>> arrays;
    std::vector<std::weak_ptr<ObjectType>> objects;
  };
  static Created *& created() { static thread_local Created * c = nullptr; return c; }
  // Empties every list and dict of c still alive: run when nothing outside the render refers to
  // them, each one alive then is held only by a reference cycle (`l.append(l)`, `ns.me = ns`),
  // which shared_ptr never frees.
  static void clear_alive(Created & c) {
    for (auto & w : c.arrays)
      if (auto a = w.lock()) a->clear();
    for (auto & w : c.objects)
      if (auto o = w.lock()) o->clear();
    c.arrays.clear();
    c.objects.clear();
  }

 private:
  template <typename T>
  static void track_in(std::vector<std::weak_ptr<T>> & list, const std::shared_ptr<T> & p) {
    if (list.size() == list.capacity() && list.size() >= 1024) {
      list.erase(std::remove_if(list.begin(), list.end(), [](const std::weak_ptr<T> & w) { return w.expired(); }), list.end());
      // mostly alive: double, so that the next scan comes after as many insertions as it scanned
      if (list.size() > list.capacity() / 2) list.reserve(2 * list.capacity());
    }
    list.emplace_back(p);
  }
  static void track(const std::shared_ptr<ArrayType> & a) { if (created() && a) track_in(created()->arrays, a); }
  static void track(const std::shared_ptr<ObjectType> & o) { if (created() && o) track_in(created()->objects, o); }

  /* Python-style string repr */
  static void dump_string(const json & primitive, std::ostringstream & out, char string_quote = '\'', bool ensure_ascii = false) {
    if (!primitive.is_string()) throw std::runtime_error("Value is not a string: " + primitive.dump());
    auto s = primitive.dump(-1, ' ', ensure_ascii);
    if (string_quote == '"' || s.find('\'') != std::string::npos) {
      out << s;
      return;
    }
    // Reuse json dump, just changing string quotes
    out << string_quote;
    for (size_t i = 1, n = s.size() - 1; i < n; ++i) {
      if (s[i] == '\\' && s[i + 1] == '"') {
        out << '"';
        i++;
      } else if (s[i] == string_quote) {
        out << '\\' << string_quote;
      } else {
        out << s[i];
      }
    }
    out << string_quote;
  }
public:
  // megakernel: json.dumps' separators (item, key), ensure_ascii and sort_keys, as HF's tojson takes them
  struct JsonStyle {
    bool custom_seps = false;
    std::string item_sep = ", ", key_sep = ": ";
    bool ensure_ascii = false, sort_keys = false;
  };
private:
  void dump(std::ostringstream & out, int indent = -1, int level = 0, bool to_json = false,
            const JsonStyle * style = nullptr) const {
    const JsonStyle * seps = style && style->custom_seps ? style : nullptr;
    const bool ensure_ascii = style && style->ensure_ascii;
    ValueNestingGuard nesting;  // megakernel
    auto print_indent = [&](int level) {
      if (indent > 0) {
          out << "\n";
          for (int i = 0, n = level * indent; i < n; ++i) out << ' ';
      }
    };
    auto print_sub_sep = [&]() {
      if (seps) {
        out << seps->item_sep;
        if (indent >= 0) print_indent(level + 1);
        return;
      }
      out << ',';
      if (indent < 0) out << ' ';
      else print_indent(level + 1);
    };

    auto string_quote = to_json ? '"' : '\'';

    if (is_null()) out << (to_json ? "null" : "None");  // megakernel: Python prints None in a list
    else if (array_ && array_->empty()) out << "[]";  // megakernel: empty on one line, as json.dumps(indent=n)
    else if (object_ && object_->empty() && !callable_) out << "{}";
    else if (array_) {
      out << "[";
      print_indent(level + 1);
      for (size_t i = 0; i < array_->size(); ++i) {
        if (i) print_sub_sep();
        (*array_)[i].dump(out, indent, level + 1, to_json, style);
      }
      print_indent(level);
      out << "]";
    } else if (object_) {
      out << "{";
      print_indent(level + 1);
      std::vector<ObjectType::const_iterator> order;
      for (auto i = object_->begin(); i != object_->end(); ++i) order.push_back(i);
      if (style && style->sort_keys)
        std::stable_sort(order.begin(), order.end(), [](const auto & a, const auto & b) { return a->first < b->first; });
      bool first_key = true;
      for (const auto & it : order) {
        if (!first_key) print_sub_sep();
        first_key = false;
        if (it->first.is_string()) {
          dump_string(it->first, out, string_quote, ensure_ascii);
        } else {
          out << string_quote << it->first.dump() << string_quote;
        }
        out << (seps ? seps->key_sep : ": ");
        it->second.dump(out, indent, level + 1, to_json, style);
      }
      print_indent(level);
      out << "}";
    } else if (callable_) {
      throw std::runtime_error("Cannot dump callable to JSON");
    } else if (is_boolean() && !to_json) {
      out << (this->to_bool() ? "True" : "False");
    } else if (is_string() && !to_json) {
      dump_string(primitive_, out, string_quote);
    } else if (is_string() && ensure_ascii) {
      dump_string(primitive_, out, string_quote, true);
    } else if (is_number_float()) {
      // megakernel: Python's repr (1e15 is 1000000000000000.0; inf, nan), also for json.dumps
      // (Infinity, NaN); nlohmann wrote 1e+15 and null
      const double d = get<double>();
      out << (to_json && !std::isfinite(d) ? (std::isnan(d) ? "NaN" : d < 0 ? "-Infinity" : "Infinity") : python_float_repr(d));
    } else {
      out << primitive_.dump();
    }
  }

public:
  Value() {}
  // megakernel: a value nested 100000 deep (a template can build one in a loop) was destroyed by
  // recursion and overflowed the stack: the containers this value alone owns are taken apart
  // iteratively (each child then holds no container when it is destroyed).
  Value(const Value &) = default;
  Value(Value &&) = default;
  Value & operator=(const Value &) = default;
  Value & operator=(Value &&) = default;
  ~Value() {
    if (!(array_ && array_.use_count() == 1) && !(object_ && object_.use_count() == 1)) return;
    std::vector<std::shared_ptr<ArrayType>> arrays;
    std::vector<std::shared_ptr<ObjectType>> objects;
    auto detach = [&](Value & v) {
      if (v.array_ && v.array_.use_count() == 1) arrays.push_back(std::move(v.array_));
      if (v.object_ && v.object_.use_count() == 1) objects.push_back(std::move(v.object_));
    };
    detach(*this);
    while (!arrays.empty() || !objects.empty()) {
      if (!arrays.empty()) {
        auto a = std::move(arrays.back());
        arrays.pop_back();
        for (auto & v : *a) detach(v);
      } else {
        auto o = std::move(objects.back());
        objects.pop_back();
        for (auto & kv : *o) detach(kv.second);
      }
    }
  }
  Value(const bool& v) : primitive_(v) {}
  Value(const int64_t & v) : primitive_(v) {}
  Value(const double& v) : primitive_(v) {}
  Value(const std::nullptr_t &) {}
  Value(const std::string & v) : primitive_(v) {}
  Value(const char * v) : primitive_(std::string(v)) {}

  Value(const json & v) {
    if (v.is_object()) {
      auto object = std::make_shared<ObjectType>();
      for (auto it = v.begin(); it != v.end(); ++it) {
        (*object)[it.key()] = it.value();
      }
      object_ = std::move(object);
      track(object_);
    } else if (v.is_array()) {
      auto array = std::make_shared<ArrayType>();
      for (const auto& item : v) {
        array->push_back(Value(item));
      }
      array_ = array;
      track(array_);
    } else {
      primitive_ = v;
    }
  }

  std::vector<Value> keys() {
    if (!object_) throw std::runtime_error("Value is not an object: " + dump());
    std::vector<Value> res;
    for (const auto& item : *object_) {
      res.push_back(item.first);
    }
    return res;
  }

  size_t size() const {
    if (is_object()) return object_->size();
    if (is_array()) return array_->size();
    if (is_string()) return static_cast<size_t>(utf8_length(primitive_.get_ref<const std::string &>()));  // megakernel: code points
    throw std::runtime_error("Value is not an array or object: " + dump());
  }

  static Value array(const std::vector<Value> values = {}) {
    auto array = std::make_shared<ArrayType>();
    for (const auto& item : values) {
      array->push_back(item);
    }
    return Value(array);
  }
  static Value object(const std::shared_ptr<ObjectType> object = std::make_shared<ObjectType>()) {
    return Value(object);
  }
  static Value callable(const CallableType & callable) {
    return Value(std::make_shared<CallableType>(callable));
  }

  void insert(size_t index, const Value& v) {
    if (!array_)
      throw std::runtime_error("Value is not an array: " + dump());
    array_->insert(array_->begin() + index, v);
  }
  void push_back(const Value& v) {
    if (!array_)
      throw std::runtime_error("Value is not an array: " + dump());
    array_->push_back(v);
  }
  Value pop(const Value& index) {
    if (is_array()) {
      if (array_->empty())
        throw std::runtime_error("pop from empty list");
      if (index.is_null()) {
        auto ret = array_->back();
        array_->pop_back();
        return ret;
      } else if (!index.is_number_integer()) {
        throw std::runtime_error("pop index must be an integer: " + index.dump());
      } else {
        auto i = index.get<int>();
        if (i < 0 || i >= static_cast<int>(array_->size()))
          throw std::runtime_error("pop index out of range: " + index.dump());
        auto it = array_->begin() + (i < 0 ? array_->size() + i : i);
        auto ret = *it;
        array_->erase(it);
        return ret;
      }
    } else if (is_object()) {
      if (!index.is_hashable())
        throw std::runtime_error("Unhashable type: " + index.dump());
      auto it = object_->find(index.primitive_);
      if (it == object_->end())
        throw std::runtime_error("Key not found: " + index.dump());
      auto ret = it->second;
      object_->erase(it);
      return ret;
    } else {
      throw std::runtime_error("Value is not an array or object: " + dump());
    }
  }
  Value get(const Value& key) {
    if (array_) {
      if (!key.is_number_integer()) {
        return Value();
      }
      // megakernel: out of range is undefined (renders empty), as in jinja2; upstream threw
      // std::out_of_range with the C++ library's message.
      auto index = key.get<int64_t>();
      if (index < 0) index += static_cast<int64_t>(array_->size());
      if (index < 0 || index >= static_cast<int64_t>(array_->size())) return Value();
      return (*array_)[static_cast<size_t>(index)];
    } else if (object_) {
      // megakernel: an unhashable key (a list, a dict) finds nothing, as jinja2's getitem gives
      // undefined (upstream threw "Unhashable type" naming the dict)
      if (!key.is_hashable()) return Value();
      auto it = object_->find(key.primitive_);
      if (it == object_->end()) return Value();
      return it->second;
    } else if (is_string() && key.is_number_integer()) {
      // megakernel: `s[i]` is the i-th code point (negative from the end), undefined out of range,
      // as in jinja2; upstream returned null for every index.
      const auto & str = primitive_.get_ref<const std::string &>();
      int64_t index = key.get<int64_t>();
      if (index < 0) index += utf8_length(str);
      if (index < 0) return Value();
      const size_t at = utf8_offset(str, index);
      if (at >= str.size()) return Value();
      return str.substr(at, utf8_next(str, at) - at);
    }
    return Value();
  }
  void set(const Value& key, const Value& value) {
    if (!object_) throw std::runtime_error("Value is not an object: " + dump());
    if (!key.is_hashable()) throw std::runtime_error("Unhashable type: " + dump());
    (*object_)[key.primitive_] = value;
  }
  Value call(const std::shared_ptr<Context> & context, ArgumentsValue & args) const {
    if (!callable_) throw std::runtime_error("Value is not callable: " + dump());
    return (*callable_)(context, args);
  }

  bool is_object() const { return !!object_; }
  bool is_array() const { return !!array_; }
  bool is_callable() const { return !!callable_; }
  bool is_null() const { return !object_ && !array_ && primitive_.is_null() && !callable_; }
  bool is_boolean() const { return primitive_.is_boolean(); }
  bool is_number_integer() const { return primitive_.is_number_integer(); }
  bool is_number_float() const { return primitive_.is_number_float(); }
  bool is_number() const { return primitive_.is_number(); }
  bool is_string() const { return primitive_.is_string(); }
  bool is_iterable() const { return is_array() || is_object() || is_string(); }

  bool is_primitive() const { return !array_ && !object_ && !callable_; }
  bool is_hashable() const { return is_primitive(); }

  bool empty() const {
    if (is_null())
      throw std::runtime_error("Undefined value or reference");
    if (is_string()) return primitive_.empty();
    if (is_array()) return array_->empty();
    if (is_object()) return object_->empty();
    return false;
  }

  void for_each(const std::function<void(Value &)> & callback) const {
    if (is_null())
      throw std::runtime_error("Undefined value or reference");
    if (array_) {
      for (auto& item : *array_) {
        callback(item);
      }
    } else if (object_) {
      for (auto & item : *object_) {
        Value key(item.first);
        callback(key);
      }
    } else if (is_string()) {
      // megakernel: one code point at a time (upstream: one byte at a time)
      const auto str = primitive_.get<std::string>();
      for (size_t i = 0, next; i < str.size(); i = next) {
        next = utf8_next(str, i);
        auto val = Value(str.substr(i, next - i));
        callback(val);
      }
    } else {
      throw std::runtime_error("Value is not iterable: " + dump());
    }
  }

  bool to_bool() const {
    if (is_null()) return false;
    if (is_boolean()) return get<bool>();
    if (is_number()) return get<double>() != 0;
    if (is_string()) return !get<std::string>().empty();
    if (is_array()) return !empty();
    if (is_object() && !callable_) return !object_->empty();  // megakernel: {} is false, as in Python
    return true;
  }

  int64_t to_int() const {
    if (is_null()) return 0;
    if (is_boolean()) return get<bool>() ? 1 : 0;
    if (is_number()) return static_cast<int64_t>(get<double>());
    if (is_string()) {
      try {
        return std::stol(get<std::string>());
      } catch (const std::exception &) {
        return 0;
      }
    }
    return 0;
  }

  bool operator<(const Value & other) const {
    if (is_null())
      throw std::runtime_error("Undefined value or reference");
    if (is_number() && other.is_number()) return get<double>() < other.get<double>();
    if (is_string() && other.is_string()) return get<std::string>() < other.get<std::string>();
    throw std::runtime_error("Cannot compare values: " + dump() + " < " + other.dump());
  }
  bool operator>=(const Value & other) const { return !(*this < other); }

  bool operator>(const Value & other) const {
    if (is_null())
      throw std::runtime_error("Undefined value or reference");
    if (is_number() && other.is_number()) return get<double>() > other.get<double>();
    if (is_string() && other.is_string()) return get<std::string>() > other.get<std::string>();
    throw std::runtime_error("Cannot compare values: " + dump() + " > " + other.dump());
  }
  bool operator<=(const Value & other) const { return !(*this > other); }

  bool operator==(const Value & other) const {
    ValueNestingGuard nesting;  // megakernel
    if (callable_ || other.callable_) {
      if (callable_.get() != other.callable_.get()) return false;
    }
    if (array_) {
      if (!other.array_) return false;
      if (array_->size() != other.array_->size()) return false;
      for (size_t i = 0; i < array_->size(); ++i) {
        if (!(*array_)[i].to_bool() || !(*other.array_)[i].to_bool() || (*array_)[i] != (*other.array_)[i]) return false;
      }
      return true;
    } else if (object_) {
      if (!other.object_) return false;
      if (object_->size() != other.object_->size()) return false;
      for (const auto& item : *object_) {
        if (!item.second.to_bool() || !other.object_->count(item.first) || item.second != other.object_->at(item.first)) return false;
      }
      return true;
    } else {
      return primitive_ == other.primitive_;
    }
  }
  bool operator!=(const Value & other) const { return !(*this == other); }

  bool contains(const char * key) const { return contains(std::string(key)); }
  bool contains(const std::string & key) const {
    if (array_) {
      return false;
    } else if (object_) {
      return object_->find(key) != object_->end();
    } else {
      throw std::runtime_error("contains can only be called on arrays and objects: " + dump());
    }
  }
  bool contains(const Value & value) const {
    if (is_null())
      throw std::runtime_error("Undefined value or reference");
    if (array_) {
      for (const auto& item : *array_) {
        if (item.to_bool() && item == value) return true;
      }
      return false;
    } else if (object_) {
      if (!value.is_hashable()) throw std::runtime_error("Unhashable type: " + value.dump());
      return object_->find(value.primitive_) != object_->end();
    } else {
      throw std::runtime_error("contains can only be called on arrays and objects: " + dump());
    }
  }
  void erase(size_t index) {
    if (!array_) throw std::runtime_error("Value is not an array: " + dump());
    array_->erase(array_->begin() + index);
  }
  void erase(const std::string & key) {
    if (!object_) throw std::runtime_error("Value is not an object: " + dump());
    object_->erase(key);
  }
  const Value& at(const Value & index) const {
    return const_cast<Value*>(this)->at(index);
  }
  Value& at(const Value & index) {
    if (!index.is_hashable()) throw std::runtime_error("Unhashable type: " + dump());
    if (is_array()) return array_->at(index.get<int>());
    if (is_object()) return object_->at(index.primitive_);
    throw std::runtime_error("Value is not an array or object: " + dump());
  }
  const Value& at(size_t index) const {
    return const_cast<Value*>(this)->at(index);
  }
  Value& at(size_t index) {
    if (is_null())
      throw std::runtime_error("Undefined value or reference");
    if (is_array()) return array_->at(index);
    if (is_object()) return object_->at(index);
    throw std::runtime_error("Value is not an array or object: " + dump());
  }

  template <typename T>
  T get(const std::string & key, T default_value) const {
    if (!contains(key)) return default_value;
    return at(key).get<T>();
  }

  template <typename T>
  T get() const {
    if (is_primitive()) return primitive_.get<T>();
    throw std::runtime_error("get<T> not defined for this value type: " + dump());
  }

  std::string dump(int indent=-1, bool to_json=false) const {
    std::ostringstream out;
    dump(out, indent, 0, to_json);
    return out.str();
  }
  // megakernel: JSON in a json.dumps style (separators, ensure_ascii, sort_keys)
  std::string dump_json(int indent, const JsonStyle & style) const {
    std::ostringstream out;
    dump(out, indent, 0, /* to_json= */ true, &style);
    return out.str();
  }

  Value operator-() const {
      if (is_number_integer())
        return -get<int64_t>();
      else
        return -get<double>();
  }
  std::string to_str() const {
    if (is_string()) return get<std::string>();
    if (is_number_integer()) return std::to_string(get<int64_t>());
    if (is_number_float()) return python_float_repr(get<double>());  // megakernel: was "0.100000"
    if (is_boolean()) return get<bool>() ? "True" : "False";
    if (is_null()) return "None";
    return dump();
  }
  Value operator+(const Value& rhs) const {
      if (is_string() || rhs.is_string()) {
        return to_str() + rhs.to_str();
      } else if (is_number_integer() && rhs.is_number_integer()) {
        return get<int64_t>() + rhs.get<int64_t>();
      } else if (is_array() && rhs.is_array()) {
        // megakernel: bounded (a list doubled in a loop grows exponentially)
        if (array_->size() + rhs.array_->size() > limits::kMaxItems)
          throw LimitError("template limit: a list of more than " + std::to_string(limits::kMaxItems) + " items");
        auto res = Value::array();
        for (const auto& item : *array_) res.push_back(item);
        for (const auto& item : *rhs.array_) res.push_back(item);
        return res;
      } else {
        return get<double>() + rhs.get<double>();
      }
  }
  Value operator-(const Value& rhs) const {
      if (is_number_integer() && rhs.is_number_integer())
        return get<int64_t>() - rhs.get<int64_t>();
      else
        return get<double>() - rhs.get<double>();
  }
  Value operator*(const Value& rhs) const {
      if (is_string() && rhs.is_number_integer()) {
        // megakernel: the size is checked before building it (and "" * 10**18 must not loop)
        const auto n = rhs.get<int64_t>();
        const auto piece = to_str();
        if (n <= 0 || piece.empty()) return std::string();
        if (static_cast<uint64_t>(n) > limits::kMaxStringLength / piece.size())
          throw LimitError("template limit: a string of " + std::to_string(piece.size()) + " bytes repeated " + std::to_string(n) + " times (at most " + std::to_string(limits::kMaxStringLength) + " bytes)");
        std::string out;
        out.reserve(piece.size() * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out += piece;
        return out;
      }
      else if (is_number_integer() && rhs.is_number_integer())
        return get<int64_t>() * rhs.get<int64_t>();
      else
        return get<double>() * rhs.get<double>();
  }
  // megakernel: Python's arithmetic (upstream: `/` of integers truncated, `//` and `%` rounded toward
  // zero, `**` always gave a float): `/` is true division (a float), `//` and `%` floor (the
  // remainder takes the divisor's sign), int ** int (exponent >= 0) is an int. Division by zero is
  // an error, as x / 0 and INT64_MIN / -1 are undefined in C++ (SIGFPE).
  Value operator/(const Value& rhs) const {
      const double b = rhs.get<double>();
      if (b == 0) throw std::runtime_error("division by zero");
      return get<double>() / b;
  }
  Value floor_divide(const Value& rhs) const {
    if (is_number_integer() && rhs.is_number_integer()) return int_divide(get<int64_t>(), rhs.get<int64_t>());
    const double b = rhs.get<double>();
    if (b == 0) throw std::runtime_error("float floor division by zero");
    return std::floor(get<double>() / b);
  }
  Value operator%(const Value& rhs) const {
    if (is_number_integer() && rhs.is_number_integer()) {
      const auto a = get<int64_t>(), b = rhs.get<int64_t>();
      if (b == 0) throw std::runtime_error("integer modulo by zero");
      if (b == -1) return int64_t{0};
      int64_t m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return m;
    }
    const double b = rhs.get<double>();
    if (b == 0) throw std::runtime_error("float modulo by zero");
    double m = std::fmod(get<double>(), b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
  }
  Value power(const Value& rhs) const {
    if (is_number_integer() && rhs.is_number_integer() && rhs.get<int64_t>() >= 0) {
      int64_t base = get<int64_t>(), e = rhs.get<int64_t>(), result = 1;
      while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(result, base, &result)) throw std::runtime_error("integer power overflows");
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) throw std::runtime_error("integer power overflows");
      }
      return result;
    }
    return std::pow(get<double>(), rhs.get<double>());
  }
  // megakernel: x / 0 and INT64_MIN / -1 are undefined in C++ (SIGFPE): an error instead
  static int64_t int_divide(int64_t a, int64_t b) {  // floor division
    if (b == 0) throw std::runtime_error("integer division by zero");
    if (b == -1 && a == std::numeric_limits<int64_t>::min()) throw std::runtime_error("integer division overflows");
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
  }
};

struct ArgumentsValue {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;

  bool has_named(const std::string & name) {
    for (const auto & p : kwargs) {
      if (p.first == name) return true;
    }
    return false;
  }

  Value get_named(const std::string & name) {
    for (const auto & [key, value] : kwargs) {
      if (key == name) return value;
    }
    return Value();
  }

  bool empty() {
    return args.empty() && kwargs.empty();
  }

  void expectArgs(const std::string & method_name, const std::pair<size_t, size_t> & pos_count, const std::pair<size_t, size_t> & kw_count) {
    if (args.size() < pos_count.first || args.size() > pos_count.second || kwargs.size() < kw_count.first || kwargs.size() > kw_count.second) {
      std::ostringstream out;
      out << method_name << " must have between " << pos_count.first << " and " << pos_count.second << " positional arguments and between " << kw_count.first << " and " << kw_count.second << " keyword arguments";
      throw std::runtime_error(out.str());
    }
  }
};

template <>
inline json Value::get<json>() const {
  if (is_primitive()) return primitive_;
  ValueNestingGuard nesting;  // megakernel
  if (is_null()) return json();
  if (array_) {
    std::vector<json> res;
    for (const auto& item : *array_) {
      res.push_back(item.get<json>());
    }
    return res;
  }
  if (object_) {
    json res = json::object();
    for (const auto& [key, value] : *object_) {
      if (key.is_string()) {
        res[key.get<std::string>()] = value.get<json>();
      } else if (key.is_primitive()) {
        res[key.dump()] = value.get<json>();
      } else {
        throw std::runtime_error("Invalid key type for conversion to JSON: " + key.dump());
      }
    }
    if (is_callable()) {
      res["__callable__"] = true;
    }
    return res;
  }
  throw std::runtime_error("get<json> not defined for this value type: " + dump());
}

} // namespace minja

namespace std {
  template <>
  struct hash<minja::Value> {
    size_t operator()(const minja::Value & v) const {
      if (!v.is_hashable())
        throw std::runtime_error("Unsupported type for hashing: " + v.dump());
      return std::hash<json>()(v.get<json>());
    }
  };
} // namespace std

namespace minja {

static std::string error_location_suffix(const std::string & source, size_t pos) {
  auto get_line = [&](size_t line) {
    auto start = source.begin();
    for (size_t i = 1; i < line; ++i) {
      start = std::find(start, source.end(), '\n') + 1;
    }
    auto end = std::find(start, source.end(), '\n');
    return std::string(start, end);
  };
  auto start = source.begin();
  auto end = source.end();
  auto it = start + pos;
  auto line = std::count(start, it, '\n') + 1;
  auto max_line = std::count(start, end, '\n') + 1;
  auto col = pos - std::string(start, it).rfind('\n');
  std::ostringstream out;
  out << " at row " << line << ", column " << col << ":\n";
  if (line > 1) out << get_line(line - 1) << "\n";
  out << get_line(line) << "\n";
  out << std::string(col - 1, ' ') << "^\n";
  if (line < max_line) out << get_line(line + 1) << "\n";

  return out.str();
}

// megakernel: frees what reference cycles a render leaves. Install one on the stack before the
// template is parsed and its context made, so that it is destroyed after both: every list and dict
// made meanwhile that is still alive then is held only by a cycle, and is emptied. The outermost
// one on a thread collects; nested ones do nothing.
class CycleCollector {
  Value::Created created_;
  bool outer_;
 public:
  CycleCollector() : outer_(Value::created() == nullptr) { if (outer_) Value::created() = &created_; }
  ~CycleCollector() {
    if (!outer_) return;
    Value::created() = nullptr;
    Value::clear_alive(created_);
  }
  CycleCollector(const CycleCollector &) = delete;
  CycleCollector & operator=(const CycleCollector &) = delete;
};

class Context : public std::enable_shared_from_this<Context> {
  protected:
    Value values_;
    std::shared_ptr<Context> parent_;
  public:
    Context(Value && values, const std::shared_ptr<Context> & parent = nullptr) : values_(std::move(values)), parent_(parent) {
        if (!values_.is_object()) throw std::runtime_error("Context values must be an object: " + values_.dump());
    }
    virtual ~Context() {}

    static std::shared_ptr<Context> builtins();
    static std::shared_ptr<Context> make(Value && values, const std::shared_ptr<Context> & parent = builtins());

    std::vector<Value> keys() {
        return values_.keys();
    }
    virtual Value get(const Value & key) {
        if (values_.contains(key)) return values_.at(key);
        if (parent_) return parent_->get(key);
        return Value();
    }
    virtual Value & at(const Value & key) {
        if (values_.contains(key)) return values_.at(key);
        if (parent_) return parent_->at(key);
        throw std::runtime_error("Undefined variable: " + key.dump());
    }
    virtual bool contains(const Value & key) {
        if (values_.contains(key)) return true;
        if (parent_) return parent_->contains(key);
        return false;
    }
    virtual void set(const Value & key, const Value & value) {
        values_.set(key, value);
    }
};

struct Location {
    std::shared_ptr<std::string> source;
    size_t pos;
};

class Expression {
protected:
    virtual Value do_evaluate(const std::shared_ptr<Context> & context) const = 0;
public:
    using Parameters = std::vector<std::pair<std::string, std::shared_ptr<Expression>>>;

    Location location;

    Expression(const Location & location) : location(location) {
        // megakernel: one tag's expression tree is bounded (its depth, hence the recursion of
        // evaluating and destroying it, with it)
        if (parse_budget && ++parse_budget->nodes > limits::kMaxExpressionNodes)
            throw LimitError("template limit: an expression of more than " + std::to_string(limits::kMaxExpressionNodes) + " parts");
    }
    virtual ~Expression() = default;

    Value evaluate(const std::shared_ptr<Context> & context) const {
        try {
            FrameGuard frame;  // megakernel: steps and nesting bounded
            Value result = do_evaluate(context);
            if (result.is_string()) check_string_length(result.get<std::string>().size());
            return result;
        } catch (const LimitError & e) {
            if (e.located || !location.source) throw;
            throw LimitError(e.what() + error_location_suffix(*location.source, location.pos), true);
        } catch (const LocatedError &) {
            throw;
        } catch (const std::exception & e) {
            if (!location.source) throw;
            throw LocatedError(e.what() + error_location_suffix(*location.source, location.pos));
        }
    }
};

class VariableExpr : public Expression {
    std::string name;
public:
    VariableExpr(const Location & loc, const std::string& n)
      : Expression(loc), name(n) {}
    std::string get_name() const { return name; }
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        if (!context->contains(name)) {
            return Value();
        }
        return context->at(name);
    }
};

static void destructuring_assign(const std::vector<std::string> & var_names, const std::shared_ptr<Context> & context, Value& item) {
  if (var_names.size() == 1) {
      Value name(var_names[0]);
      context->set(name, item);
  } else {
      if (!item.is_array() || item.size() != var_names.size()) {
          throw std::runtime_error("Mismatched number of variables and items in destructuring assignment");
      }
      for (size_t i = 0; i < var_names.size(); ++i) {
          context->set(var_names[i], item.at(i));
      }
  }
}

enum SpaceHandling { Keep, Strip, StripSpaces, StripNewline };

class TemplateToken {
public:
    enum class Type { Text, Expression, If, Else, Elif, EndIf, For, EndFor, Generation, EndGeneration, Set, EndSet, Comment, Macro, EndMacro, Filter, EndFilter, Break, Continue };

    static std::string typeToString(Type t) {
        switch (t) {
            case Type::Text: return "text";
            case Type::Expression: return "expression";
            case Type::If: return "if";
            case Type::Else: return "else";
            case Type::Elif: return "elif";
            case Type::EndIf: return "endif";
            case Type::For: return "for";
            case Type::EndFor: return "endfor";
            case Type::Set: return "set";
            case Type::EndSet: return "endset";
            case Type::Comment: return "comment";
            case Type::Macro: return "macro";
            case Type::EndMacro: return "endmacro";
            case Type::Filter: return "filter";
            case Type::EndFilter: return "endfilter";
            case Type::Generation: return "generation";
            case Type::EndGeneration: return "endgeneration";
            case Type::Break: return "break";
            case Type::Continue: return "continue";
        }
        return "Unknown";
    }

    TemplateToken(Type type, const Location & location, SpaceHandling pre, SpaceHandling post) : type(type), location(location), pre_space(pre), post_space(post) {}
    virtual ~TemplateToken() = default;

    Type type;
    Location location;
    SpaceHandling pre_space = SpaceHandling::Keep;
    SpaceHandling post_space = SpaceHandling::Keep;
};

struct TextTemplateToken : public TemplateToken {
    std::string text;
    TextTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, const std::string& t) : TemplateToken(Type::Text, loc, pre, post), text(t) {}
};

struct ExpressionTemplateToken : public TemplateToken {
    std::shared_ptr<Expression> expr;
    ExpressionTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, std::shared_ptr<Expression> && e) : TemplateToken(Type::Expression, loc, pre, post), expr(std::move(e)) {}
};

struct IfTemplateToken : public TemplateToken {
    std::shared_ptr<Expression> condition;
    IfTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, std::shared_ptr<Expression> && c) : TemplateToken(Type::If, loc, pre, post), condition(std::move(c)) {}
};

struct ElifTemplateToken : public TemplateToken {
    std::shared_ptr<Expression> condition;
    ElifTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, std::shared_ptr<Expression> && c) : TemplateToken(Type::Elif, loc, pre, post), condition(std::move(c)) {}
};

struct ElseTemplateToken : public TemplateToken {
    ElseTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post) : TemplateToken(Type::Else, loc, pre, post) {}
};

struct EndIfTemplateToken : public TemplateToken {
    EndIfTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post) : TemplateToken(Type::EndIf, loc, pre, post) {}
};

struct MacroTemplateToken : public TemplateToken {
    std::shared_ptr<VariableExpr> name;
    Expression::Parameters params;
    MacroTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, std::shared_ptr<VariableExpr> && n, Expression::Parameters && p)
      : TemplateToken(Type::Macro, loc, pre, post), name(std::move(n)), params(std::move(p)) {}
};

struct EndMacroTemplateToken : public TemplateToken {
    EndMacroTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post) : TemplateToken(Type::EndMacro, loc, pre, post) {}
};

struct FilterTemplateToken : public TemplateToken {
    std::shared_ptr<Expression> filter;
    FilterTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, std::shared_ptr<Expression> && filter)
      : TemplateToken(Type::Filter, loc, pre, post), filter(std::move(filter)) {}
};

struct EndFilterTemplateToken : public TemplateToken {
    EndFilterTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post) : TemplateToken(Type::EndFilter, loc, pre, post) {}
};

struct ForTemplateToken : public TemplateToken {
    std::vector<std::string> var_names;
    std::shared_ptr<Expression> iterable;
    std::shared_ptr<Expression> condition;
    bool recursive;
    ForTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, const std::vector<std::string> & vns, std::shared_ptr<Expression> && iter,
      std::shared_ptr<Expression> && c, bool r)
      : TemplateToken(Type::For, loc, pre, post), var_names(vns), iterable(std::move(iter)), condition(std::move(c)), recursive(r) {}
};

struct EndForTemplateToken : public TemplateToken {
    EndForTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post) : TemplateToken(Type::EndFor, loc, pre, post) {}
};

struct GenerationTemplateToken : public TemplateToken {
    GenerationTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post) : TemplateToken(Type::Generation, loc, pre, post) {}
};

struct EndGenerationTemplateToken : public TemplateToken {
    EndGenerationTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post) : TemplateToken(Type::EndGeneration, loc, pre, post) {}
};

struct SetTemplateToken : public TemplateToken {
    std::string ns;
    std::vector<std::string> var_names;
    std::shared_ptr<Expression> value;
    SetTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, const std::string & ns, const std::vector<std::string> & vns, std::shared_ptr<Expression> && v)
      : TemplateToken(Type::Set, loc, pre, post), ns(ns), var_names(vns), value(std::move(v)) {}
};

struct EndSetTemplateToken : public TemplateToken {
    EndSetTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post) : TemplateToken(Type::EndSet, loc, pre, post) {}
};

struct CommentTemplateToken : public TemplateToken {
    std::string text;
    CommentTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, const std::string& t) : TemplateToken(Type::Comment, loc, pre, post), text(t) {}
};

enum class LoopControlType { Break, Continue };

class LoopControlException : public std::runtime_error {
public:
    LoopControlType control_type;
    LoopControlException(const std::string & message, LoopControlType control_type) : std::runtime_error(message), control_type(control_type) {}
    LoopControlException(LoopControlType control_type)
      : std::runtime_error((control_type == LoopControlType::Continue ? "continue" : "break") + std::string(" outside of a loop")),
        control_type(control_type) {}
};

struct LoopControlTemplateToken : public TemplateToken {
    LoopControlType control_type;
    LoopControlTemplateToken(const Location & loc, SpaceHandling pre, SpaceHandling post, LoopControlType control_type) : TemplateToken(Type::Break, loc, pre, post), control_type(control_type) {}
};

class TemplateNode {
    Location location_;
protected:
    virtual void do_render(std::ostringstream & out, const std::shared_ptr<Context> & context) const = 0;

public:
    TemplateNode(const Location & location) : location_(location) {}
    void render(std::ostringstream & out, const std::shared_ptr<Context> & context) const {
        try {
            FrameGuard frame;  // megakernel: steps and nesting bounded, the output too
            do_render(out, context);
            const auto pos = out.tellp();
            if (pos > 0) check_string_length(static_cast<size_t>(pos));
        } catch (const LimitError & e) {
            if (e.located || !location_.source) throw;
            throw LimitError(e.what() + error_location_suffix(*location_.source, location_.pos), true);
        } catch (const LoopControlException & e) {
            // TODO: make stack creation lazy. Only needed if it was thrown outside of a loop.
            std::ostringstream err;
            err << e.what();
            if (location_.source) err << error_location_suffix(*location_.source, location_.pos);
            throw LoopControlException(err.str(), e.control_type);
        } catch (const LocatedError &) {
            throw;
        } catch (const std::exception & e) {
            if (!location_.source) throw;
            throw LocatedError(e.what() + error_location_suffix(*location_.source, location_.pos));
        }
    }
    const Location & location() const { return location_; }
    virtual ~TemplateNode() = default;
    std::string render(const std::shared_ptr<Context> & context) const {
        RenderScope scope;  // megakernel: the outermost render owns the budget
        std::ostringstream out;
        render(out, context);
        return out.str();
    }
};

class SequenceNode : public TemplateNode {
    std::vector<std::shared_ptr<TemplateNode>> children;
public:
    SequenceNode(const Location & loc, std::vector<std::shared_ptr<TemplateNode>> && c)
      : TemplateNode(loc), children(std::move(c)) {}
    void do_render(std::ostringstream & out, const std::shared_ptr<Context> & context) const override {
        for (const auto& child : children) child->render(out, context);
    }
};

class TextNode : public TemplateNode {
    std::string text;
public:
    TextNode(const Location & loc, const std::string& t) : TemplateNode(loc), text(t) {}
    void do_render(std::ostringstream & out, const std::shared_ptr<Context> &) const override {
      out << text;
    }
};

class ExpressionNode : public TemplateNode {
    std::shared_ptr<Expression> expr;
public:
    ExpressionNode(const Location & loc, std::shared_ptr<Expression> && e) : TemplateNode(loc), expr(std::move(e)) {}
    void do_render(std::ostringstream & out, const std::shared_ptr<Context> & context) const override {
      if (!expr) throw std::runtime_error("ExpressionNode.expr is null");
      auto result = expr->evaluate(context);
      if (result.is_string()) {
          out << result.get<std::string>();
      } else if (result.is_boolean()) {
          out << (result.get<bool>() ? "True" : "False");
      } else if (!result.is_null()) {
          out << result.dump();
      }
  }
};

class IfNode : public TemplateNode {
    std::vector<std::pair<std::shared_ptr<Expression>, std::shared_ptr<TemplateNode>>> cascade;
public:
    IfNode(const Location & loc, std::vector<std::pair<std::shared_ptr<Expression>, std::shared_ptr<TemplateNode>>> && c)
        : TemplateNode(loc), cascade(std::move(c)) {}
    void do_render(std::ostringstream & out, const std::shared_ptr<Context> & context) const override {
      for (const auto& branch : cascade) {
          auto enter_branch = true;
          if (branch.first) {
            enter_branch = branch.first->evaluate(context).to_bool();
          }
          if (enter_branch) {
            if (!branch.second) throw std::runtime_error("IfNode.cascade.second is null");
              branch.second->render(out, context);
              return;
          }
      }
    }
};

class LoopControlNode : public TemplateNode {
    LoopControlType control_type_;
  public:
    LoopControlNode(const Location & loc, LoopControlType control_type) : TemplateNode(loc), control_type_(control_type) {}
    void do_render(std::ostringstream &, const std::shared_ptr<Context> &) const override {
      throw LoopControlException(control_type_);
    }
};

class ForNode : public TemplateNode {
    std::vector<std::string> var_names;
    std::shared_ptr<Expression> iterable;
    std::shared_ptr<Expression> condition;
    std::shared_ptr<TemplateNode> body;
    bool recursive;
    std::shared_ptr<TemplateNode> else_body;
public:
    ForNode(const Location & loc, std::vector<std::string> && var_names, std::shared_ptr<Expression> && iterable,
      std::shared_ptr<Expression> && condition, std::shared_ptr<TemplateNode> && body, bool recursive, std::shared_ptr<TemplateNode> && else_body)
            : TemplateNode(loc), var_names(var_names), iterable(std::move(iterable)), condition(std::move(condition)), body(std::move(body)), recursive(recursive), else_body(std::move(else_body)) {}

    void do_render(std::ostringstream & out, const std::shared_ptr<Context> & context) const override {
      // https://jinja.palletsprojects.com/en/3.0.x/templates/#for
      if (!iterable) throw std::runtime_error("ForNode.iterable is null");
      if (!body) throw std::runtime_error("ForNode.body is null");

      auto iterable_value = iterable->evaluate(context);
      Value::CallableType loop_function;

      // megakernel: a recursive loop(x) iterates x (upstream iterated the outer iterable again, an
      // endless recursion), one level deeper: loop.depth (1 at the top) and loop.depth0, as jinja2.
      int64_t depth = 0;
      std::function<void(Value&)> visit = [&](Value& iter) {
          ++depth;
          struct Leave { int64_t & d; ~Leave() { --d; } } leave{depth};
          auto filtered_items = Value::array();
          if (!iter.is_null()) {
            if (!iter.is_iterable()) {
              throw std::runtime_error("For loop iterable must be iterable: " + iter.dump());
            }
            // megakernel: the loop variables of the filter live in a scope of their own (upstream
            // assigned them in the enclosing scope, so `t` kept the last item after the loop)
            auto filter_context = Context::make(Value::object(), context);
            iter.for_each([&](Value & item) {
                destructuring_assign(var_names, filter_context, item);
                if (!condition || condition->evaluate(filter_context).to_bool()) {
                  filtered_items.push_back(item);
                }
            });
          }
          if (filtered_items.empty()) {
            if (else_body) {
              else_body->render(out, context);
            }
          } else {
              auto loop = recursive ? Value::callable(loop_function) : Value::object();
              loop.set("length", (int64_t) filtered_items.size());
              loop.set("depth", depth);
              loop.set("depth0", depth - 1);

              size_t cycle_index = 0;
              loop.set("cycle", Value::callable([&](const std::shared_ptr<Context> &, ArgumentsValue & args) {
                  if (args.args.empty() || !args.kwargs.empty()) {
                      throw std::runtime_error("cycle() expects at least 1 positional argument and no named arg");
                  }
                  auto item = args.args[cycle_index];
                  cycle_index = (cycle_index + 1) % args.args.size();
                  return item;
              }));
              auto loop_context = Context::make(Value::object(), context);
              loop_context->set("loop", loop);
              for (size_t i = 0, n = filtered_items.size(); i < n; ++i) {
                  auto & item = filtered_items.at(i);
                  // megakernel: each iteration has its own scope, as in jinja2: a `set` in one
                  // iteration is gone in the next (upstream carried it over)
                  auto iter_context = Context::make(Value::object(), loop_context);
                  destructuring_assign(var_names, iter_context, item);
                  loop.set("index", (int64_t) i + 1);
                  loop.set("index0", (int64_t) i);
                  loop.set("revindex", (int64_t) (n - i));
                  loop.set("revindex0", (int64_t) (n - i - 1));
                  loop.set("length", (int64_t) n);
                  loop.set("first", i == 0);
                  loop.set("last", i == (n - 1));
                  loop.set("previtem", i > 0 ? filtered_items.at(i - 1) : Value());
                  loop.set("nextitem", i < n - 1 ? filtered_items.at(i + 1) : Value());
                  try {
                      body->render(out, iter_context);
                  } catch (const LoopControlException & e) {
                      if (e.control_type == LoopControlType::Break) break;
                      if (e.control_type == LoopControlType::Continue) continue;
                  }
              }
          }
      };

      if (recursive) {
        loop_function = [&](const std::shared_ptr<Context> &, ArgumentsValue & args) {
            CallGuard call("recursive loop()");  // megakernel: recursion bounded
            if (args.args.size() != 1 || !args.kwargs.empty() || !args.args[0].is_array()) {
                throw std::runtime_error("loop() expects exactly 1 positional iterable argument");
            }
            auto & items = args.args[0];
            visit(items);
            return Value();
        };
      }

      visit(iterable_value);
  }
};

class MacroNode : public TemplateNode {
    std::shared_ptr<VariableExpr> name;
    Expression::Parameters params;
    std::shared_ptr<TemplateNode> body;
    std::unordered_map<std::string, size_t> named_param_positions;
public:
    MacroNode(const Location & loc, std::shared_ptr<VariableExpr> && n, Expression::Parameters && p, std::shared_ptr<TemplateNode> && b)
        : TemplateNode(loc), name(std::move(n)), params(std::move(p)), body(std::move(b)) {
        for (size_t i = 0; i < params.size(); ++i) {
          const auto & name = params[i].first;
          if (!name.empty()) {
            named_param_positions[name] = i;
          }
        }
    }
    void do_render(std::ostringstream &, const std::shared_ptr<Context> & macro_context) const override {
        if (!name) throw std::runtime_error("MacroNode.name is null");
        if (!body) throw std::runtime_error("MacroNode.body is null");
        auto callable = Value::callable([&](const std::shared_ptr<Context> & context, ArgumentsValue & args) {
            CallGuard call("macro " + name->get_name());  // megakernel: recursion bounded
            // megakernel: each call has its own scope, as in jinja2: parameters and `set`s inside the
            // macro stay there (upstream wrote them into the defining scope, so f(messages=...) replaced
            // the template's messages and a nested call overwrote its caller's parameters)
            auto call_context = Context::make(Value::object(), macro_context);
            std::vector<bool> param_set(params.size(), false);
            for (size_t i = 0, n = args.args.size(); i < n; i++) {
                auto & arg = args.args[i];
                if (i >= params.size()) throw std::runtime_error("Too many positional arguments for macro " + name->get_name());
                param_set[i] = true;
                auto & param_name = params[i].first;
                call_context->set(param_name, arg);
            }
            for (auto & [arg_name, value] : args.kwargs) {
                auto it = named_param_positions.find(arg_name);
                if (it == named_param_positions.end()) throw std::runtime_error("Unknown parameter name for macro " + name->get_name() + ": " + arg_name);

                call_context->set(arg_name, value);
                param_set[it->second] = true;
            }
            // Set default values for parameters that were not passed
            for (size_t i = 0, n = params.size(); i < n; i++) {
                if (!param_set[i] && params[i].second != nullptr) {
                    auto val = params[i].second->evaluate(context);
                    call_context->set(params[i].first, val);
                } else if (!param_set[i]) {
                    call_context->set(params[i].first, Value());  // megakernel: undefined, not an outer name
                }
            }
            return body->render(call_context);
        });
        macro_context->set(name->get_name(), callable);
    }
};

class FilterNode : public TemplateNode {
    std::shared_ptr<Expression> filter;
    std::shared_ptr<TemplateNode> body;

public:
    FilterNode(const Location & loc, std::shared_ptr<Expression> && f, std::shared_ptr<TemplateNode> && b)
        : TemplateNode(loc), filter(std::move(f)), body(std::move(b)) {}

    void do_render(std::ostringstream & out, const std::shared_ptr<Context> & context) const override {
        if (!filter) throw std::runtime_error("FilterNode.filter is null");
        if (!body) throw std::runtime_error("FilterNode.body is null");
        auto filter_value = filter->evaluate(context);
        if (!filter_value.is_callable()) {
            throw std::runtime_error("Filter must be a callable: " + filter_value.dump());
        }
        std::string rendered_body = body->render(context);

        ArgumentsValue filter_args = {{Value(rendered_body)}, {}};
        auto result = filter_value.call(context, filter_args);
        out << result.to_str();
    }
};

class SetNode : public TemplateNode {
    std::string ns;
    std::vector<std::string> var_names;
    std::shared_ptr<Expression> value;
public:
    SetNode(const Location & loc, const std::string & ns, const std::vector<std::string> & vns, std::shared_ptr<Expression> && v)
        : TemplateNode(loc), ns(ns), var_names(vns), value(std::move(v)) {}
    void do_render(std::ostringstream &, const std::shared_ptr<Context> & context) const override {
      if (!value) throw std::runtime_error("SetNode.value is null");
      if (!ns.empty()) {
        if (var_names.size() != 1) {
          throw std::runtime_error("Namespaced set only supports a single variable name");
        }
        auto & name = var_names[0];
        auto ns_value = context->get(ns);
        if (!ns_value.is_object()) throw std::runtime_error("Namespace '" + ns + "' is not an object");
        ns_value.set(name, this->value->evaluate(context));
      } else {
        auto val = value->evaluate(context);
        destructuring_assign(var_names, context, val);
      }
    }
};

class SetTemplateNode : public TemplateNode {
    std::string name;
    std::shared_ptr<TemplateNode> template_value;
public:
    SetTemplateNode(const Location & loc, const std::string & name, std::shared_ptr<TemplateNode> && tv)
        : TemplateNode(loc), name(name), template_value(std::move(tv)) {}
    void do_render(std::ostringstream &, const std::shared_ptr<Context> & context) const override {
      if (!template_value) throw std::runtime_error("SetTemplateNode.template_value is null");
      Value value { template_value->render(context) };
      context->set(name, value);
    }
};

class IfExpr : public Expression {
    std::shared_ptr<Expression> condition;
    std::shared_ptr<Expression> then_expr;
    std::shared_ptr<Expression> else_expr;
public:
    IfExpr(const Location & loc, std::shared_ptr<Expression> && c, std::shared_ptr<Expression> && t, std::shared_ptr<Expression> && e)
        : Expression(loc), condition(std::move(c)), then_expr(std::move(t)), else_expr(std::move(e)) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
      if (!condition) throw std::runtime_error("IfExpr.condition is null");
      if (!then_expr) throw std::runtime_error("IfExpr.then_expr is null");
      if (condition->evaluate(context).to_bool()) {
        return then_expr->evaluate(context);
      }
      if (else_expr) {
        return else_expr->evaluate(context);
      }
      return nullptr;
    }
};

class LiteralExpr : public Expression {
    Value value;
public:
    LiteralExpr(const Location & loc, const Value& v)
      : Expression(loc), value(v) {}
    Value do_evaluate(const std::shared_ptr<Context> &) const override { return value; }
};

class ArrayExpr : public Expression {
    std::vector<std::shared_ptr<Expression>> elements;
public:
    ArrayExpr(const Location & loc, std::vector<std::shared_ptr<Expression>> && e)
      : Expression(loc), elements(std::move(e)) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        auto result = Value::array();
        for (const auto& e : elements) {
            if (!e) throw std::runtime_error("Array element is null");
            result.push_back(e->evaluate(context));
        }
        return result;
    }
};

class DictExpr : public Expression {
    std::vector<std::pair<std::shared_ptr<Expression>, std::shared_ptr<Expression>>> elements;
public:
    DictExpr(const Location & loc, std::vector<std::pair<std::shared_ptr<Expression>, std::shared_ptr<Expression>>> && e)
      : Expression(loc), elements(std::move(e)) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        auto result = Value::object();
        for (const auto& [key, value] : elements) {
            if (!key) throw std::runtime_error("Dict key is null");
            if (!value) throw std::runtime_error("Dict value is null");
            result.set(key->evaluate(context), value->evaluate(context));
        }
        return result;
    }
};

class SliceExpr : public Expression {
public:
    std::shared_ptr<Expression> start, end, step;
    SliceExpr(const Location & loc, std::shared_ptr<Expression> && s, std::shared_ptr<Expression> && e, std::shared_ptr<Expression> && st = nullptr)
      : Expression(loc), start(std::move(s)), end(std::move(e)), step(std::move(st)) {}
    Value do_evaluate(const std::shared_ptr<Context> &) const override {
        throw std::runtime_error("SliceExpr not implemented");
    }
};

class SubscriptExpr : public Expression {
    std::shared_ptr<Expression> base;
    std::shared_ptr<Expression> index;
public:
    SubscriptExpr(const Location & loc, std::shared_ptr<Expression> && b, std::shared_ptr<Expression> && i)
        : Expression(loc), base(std::move(b)), index(std::move(i)) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        if (!base) throw std::runtime_error("SubscriptExpr.base is null");
        if (!index) throw std::runtime_error("SubscriptExpr.index is null");
        auto target_value = base->evaluate(context);
        if (auto slice = dynamic_cast<SliceExpr*>(index.get())) {
          // megakernel: Python's slice rules (bounds clamped, `None` as omitted) over code points;
          // upstream cut bytes and read past the end of a string for `s[10:0:-1]`.
          auto bound = [&](const std::shared_ptr<Expression> & e) -> std::optional<int64_t> {
            if (!e) return std::nullopt;
            auto v = e->evaluate(context);
            if (v.is_null()) return std::nullopt;
            if (!v.is_number_integer()) throw std::runtime_error("slice indices must be integers or none, not " + v.dump());
            return v.get<int64_t>();
          };
          const auto start = bound(slice->start), stop = bound(slice->end), step_opt = bound(slice->step);
          const int64_t step = step_opt ? *step_opt : 1;
          if (target_value.is_string()) {
            const std::string s = target_value.get<std::string>();
            int64_t first, bound;
            python_slice_bounds(utf8_length(s), start, stop, step, first, bound);
            if (step == 1) {
              if (first >= bound) return std::string();
              const size_t b = utf8_offset(s, first);
              return s.substr(b, utf8_offset(s, bound - first, b) - b);
            }
            std::vector<size_t> starts;  // where each code point starts, then s.size()
            for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) starts.push_back(i);
            starts.push_back(s.size());
            std::string result;
            for (int64_t i = first; step > 0 ? i < bound : i > bound; i += step) {
              result.append(s, starts[i], starts[i + 1] - starts[i]);
            }
            return result;

          } else if (target_value.is_array()) {
            auto result = Value::array();
            int64_t first, bound;
            python_slice_bounds(static_cast<int64_t>(target_value.size()), start, stop, step, first, bound);
            for (int64_t i = first; step > 0 ? i < bound : i > bound; i += step) {
              result.push_back(target_value.at(i));
            }
            return result;
          } else {
            throw std::runtime_error(target_value.is_null() ? "Cannot subscript null" : "Subscripting only supported on arrays and strings");
          }
        } else {
          auto index_value = index->evaluate(context);
          if (target_value.is_null()) {
            if (auto t = dynamic_cast<VariableExpr*>(base.get())) {
              throw std::runtime_error("'" + t->get_name() + "' is " + (context->contains(t->get_name()) ? "null" : "not defined"));
            }
            // megakernel: `messages[5].content` names the index past the end (the base's reason)
            if (auto & r = out_of_range(); r.expr == base.get()) throw std::runtime_error(r.why);
            throw std::runtime_error("Trying to access property '" +  index_value.dump() + "' on null!");
          }
          auto result = target_value.get(index_value);
          if (result.is_null() && (target_value.is_array() || target_value.is_string()) && index_value.is_number_integer()) {
            const int64_t n = static_cast<int64_t>(target_value.size());
            const int64_t i = index_value.get<int64_t>();
            if (i >= n || i < -n)
              out_of_range() = {this, target_value.is_array()
                                          ? "list index " + std::to_string(i) + " is out of range (the list has " +
                                                std::to_string(n) + (n == 1 ? " item)" : " items)")
                                          : "string index " + std::to_string(i) + " is out of range (the string has " +
                                                std::to_string(n) + (n == 1 ? " character)" : " characters)")};
          }
          return result;
        }
    }
    // megakernel: an index out of range is undefined, as in jinja2 (it renders empty). Why, noted
    // for the subscript of this one that fails on it (the last one on this thread).
    struct OutOfRange { const Expression * expr = nullptr; std::string why; };
    static OutOfRange & out_of_range() { static thread_local OutOfRange r; return r; }
};

class UnaryOpExpr : public Expression {
public:
    enum class Op { Plus, Minus, LogicalNot, Expansion, ExpansionDict };
    std::shared_ptr<Expression> expr;
    Op op;
    UnaryOpExpr(const Location & loc, std::shared_ptr<Expression> && e, Op o)
      : Expression(loc), expr(std::move(e)), op(o) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        if (!expr) throw std::runtime_error("UnaryOpExpr.expr is null");
        auto e = expr->evaluate(context);
        switch (op) {
            case Op::Plus: return e;
            case Op::Minus: return -e;
            case Op::LogicalNot: return !e.to_bool();
            case Op::Expansion:
            case Op::ExpansionDict:
                throw std::runtime_error("Expansion operator is only supported in function calls and collections");

        }
        throw std::runtime_error("Unknown unary operator");
    }
};

static bool in(const Value & value, const Value & container) {
  return (((container.is_array() || container.is_object()) && container.contains(value)) ||
      (value.is_string() && container.is_string() &&
        container.to_str().find(value.to_str()) != std::string::npos));
}

class BinaryOpExpr : public Expression {
public:
    enum class Op { StrConcat, Add, Sub, Mul, MulMul, Div, DivDiv, Mod, Eq, Ne, Lt, Gt, Le, Ge, And, Or, In, NotIn, Is, IsNot };
private:
    std::shared_ptr<Expression> left;
    std::shared_ptr<Expression> right;
    Op op;
public:
    BinaryOpExpr(const Location & loc, std::shared_ptr<Expression> && l, std::shared_ptr<Expression> && r, Op o)
        : Expression(loc), left(std::move(l)), right(std::move(r)), op(o) {}
    // megakernel: jinja2's tests without an argument, for `x is name` and select('name')/reject
    static std::optional<bool> named_test(const std::string & name, const Value & l) {
      if (name == "none") return l.is_null();
      if (name == "boolean") return l.is_boolean();
      if (name == "integer") return l.is_number_integer();
      if (name == "float") return l.is_number_float();
      if (name == "number") return l.is_number();
      if (name == "string") return l.is_string();
      if (name == "mapping") return l.is_object();
      if (name == "iterable") return l.is_iterable() || l.is_null();  // jinja2's undefined is iterable (empty)
      if (name == "sequence") return l.is_array() || l.is_string() || l.is_object();  // jinja2: has len() and []
      if (name == "defined") return !l.is_null();
      if (name == "undefined") return l.is_null();
      if (name == "true") return l.to_bool();
      if (name == "false") return !l.to_bool();
      if (name == "odd") return l.get<int64_t>() % 2 != 0;
      if (name == "even") return l.get<int64_t>() % 2 == 0;
      return std::nullopt;
    }
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        if (!left) throw std::runtime_error("BinaryOpExpr.left is null");
        if (!right) throw std::runtime_error("BinaryOpExpr.right is null");
        auto l = left->evaluate(context);

        auto do_eval = [&](const Value & l) -> Value {
          if (op == Op::Is || op == Op::IsNot) {
            auto t = dynamic_cast<VariableExpr*>(right.get());
            if (!t) throw std::runtime_error("Right side of 'is' operator must be a variable");

            auto eval = [&]() {
              const auto & name = t->get_name();
              if (auto r = named_test(name, l)) return *r;
              throw std::runtime_error("Unknown type for 'is' operator: " + name);
            };
            auto value = eval();
            return Value(op == Op::Is ? value : !value);
          }

          if (op == Op::And) {
            // megakernel: Python's `and` gives an operand (`x and y` is x when x is false, else y);
            // upstream gave True/False, so `m.role == 'system' and m.content` rendered "True"
            if (!l.to_bool()) return l;
            return right->evaluate(context);
          } else if (op == Op::Or) {
            if (l.to_bool()) return l;
            return right->evaluate(context);
          }

          auto r = right->evaluate(context);
          switch (op) {
              case Op::StrConcat: {
                // megakernel: bounded before concatenating
                auto ls = l.to_str(), rs = r.to_str();
                check_string_length(ls.size() + rs.size());
                return ls + rs;
              }
              case Op::Add:       return l + r;
              case Op::Sub:       return l - r;
              case Op::Mul:       return l * r;
              case Op::Div:       return l / r;
              case Op::MulMul:    return l.power(r);
              case Op::DivDiv:    return l.floor_divide(r);
              case Op::Mod:       return l % r;  // megakernel: Value's %, which refuses % 0
              case Op::Eq:        return l == r;
              case Op::Ne:        return l != r;
              case Op::Lt:        return l < r;
              case Op::Gt:        return l > r;
              case Op::Le:        return l <= r;
              case Op::Ge:        return l >= r;
              case Op::In:        return in(l, r);
              case Op::NotIn:     return !in(l, r);
              default:            break;
          }
          throw std::runtime_error("Unknown binary operator");
        };

        if (l.is_callable()) {
          return Value::callable([l, do_eval](const std::shared_ptr<Context> & context, ArgumentsValue & args) {
            auto ll = l.call(context, args);
            return do_eval(ll); //args[0].second);
          });
        } else {
          return do_eval(l);
        }
    }
};

struct ArgumentsExpression {
    std::vector<std::shared_ptr<Expression>> args;
    std::vector<std::pair<std::string, std::shared_ptr<Expression>>> kwargs;

    ArgumentsValue evaluate(const std::shared_ptr<Context> & context) const {
        ArgumentsValue vargs;
        for (const auto& arg : this->args) {
            if (auto un_expr = std::dynamic_pointer_cast<UnaryOpExpr>(arg)) {
                if (un_expr->op == UnaryOpExpr::Op::Expansion) {
                    auto array = un_expr->expr->evaluate(context);
                    if (!array.is_array()) {
                        throw std::runtime_error("Expansion operator only supported on arrays");
                    }
                    array.for_each([&](Value & value) {
                        vargs.args.push_back(value);
                    });
                    continue;
                } else if (un_expr->op == UnaryOpExpr::Op::ExpansionDict) {
                    auto dict = un_expr->expr->evaluate(context);
                    if (!dict.is_object()) {
                        throw std::runtime_error("ExpansionDict operator only supported on objects");
                    }
                    dict.for_each([&](const Value & key) {
                        vargs.kwargs.push_back({key.get<std::string>(), dict.at(key)});
                    });
                    continue;
                }
            }
            vargs.args.push_back(arg->evaluate(context));
        }
        for (const auto& [name, value] : this->kwargs) {
            vargs.kwargs.push_back({name, value->evaluate(context)});
        }
        return vargs;
    }
};

static std::string strip(const std::string & s, const std::string & chars = "", bool left = true, bool right = true) {
  auto charset = chars.empty() ? " \t\n\r" : chars;
  auto start = left ? s.find_first_not_of(charset) : 0;
  if (start == std::string::npos) return "";
  auto end = right ? s.find_last_not_of(charset) : s.size() - 1;
  return s.substr(start, end - start + 1);
}

static std::vector<std::string> split(const std::string & s, const std::string & sep, int64_t maxsplit = -1) {
  // megakernel: an empty separator is an error as in Python (upstream looped for ever)
  if (sep.empty()) throw std::runtime_error("split: empty separator");
  std::vector<std::string> result;
  size_t start = 0;
  size_t end = s.find(sep);
  while (end != std::string::npos && (maxsplit < 0 || static_cast<int64_t>(result.size()) < maxsplit)) {
    result.push_back(s.substr(start, end - start));
    start = end + sep.length();
    end = s.find(sep, start);
  }
  result.push_back(s.substr(start));
  return result;
}

// megakernel: Python's str.split() without a separator: runs of whitespace split, none at either end.
static std::vector<std::string> split_whitespace(const std::string & s, int64_t maxsplit = -1) {
  static const std::string ws = " \t\n\r\v\f";
  std::vector<std::string> result;
  size_t i = s.find_first_not_of(ws);
  while (i != std::string::npos) {
    if (maxsplit >= 0 && static_cast<int64_t>(result.size()) == maxsplit) {
      result.push_back(s.substr(i));  // the rest as it is (Python keeps its trailing whitespace)
      break;
    }
    const size_t j = s.find_first_of(ws, i);
    result.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    i = j == std::string::npos ? j : s.find_first_not_of(ws, j);
  }
  return result;
}

// megakernel: case mapping by code point, as Python's str.upper/lower/capitalize/title (utf8proc's
// simple mappings; Python's full ones differ only for a few characters, e.g. 'ß'.upper() is "SS"
// there and "ß" here). Bytes that are not UTF-8 are kept as they are. fn(cp, index, prev) gives the
// mapped code point; prev is the previous code point (-1 at the start).
template <class F>
static std::string utf8_map(const std::string & s, F && fn) {
  std::string out;
  out.reserve(s.size());
  int32_t prev = -1;
  size_t index = 0;
  for (size_t i = 0; i < s.size();) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t *>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {  // not UTF-8: the byte as it is
      out += s[i++];
      prev = -1;
      ++index;
      continue;
    }
    utf8proc_uint8_t buf[4];
    const auto m = utf8proc_encode_char(fn(cp, index, prev), buf);
    out.append(reinterpret_cast<const char *>(buf), static_cast<size_t>(m));
    prev = cp;
    i += static_cast<size_t>(n);
    ++index;
  }
  return out;
}
static std::string utf8_upper(const std::string & s) {
  return utf8_map(s, [](int32_t c, size_t, int32_t) { return utf8proc_toupper(c); });
}
static std::string utf8_lower(const std::string & s) {
  return utf8_map(s, [](int32_t c, size_t, int32_t) { return utf8proc_tolower(c); });
}
// Python's str.isalpha for one code point (a letter: categories L*)
static bool utf8_is_letter(int32_t c) {
  if (c < 0) return false;
  const auto cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_LO;
}

// megakernel: as Python's str.capitalize (and Jinja2's filter): the first character title case, the rest lower
static std::string capitalize(const std::string & s) {
  return utf8_map(s, [](int32_t c, size_t i, int32_t) { return i == 0 ? utf8proc_totitle(c) : utf8proc_tolower(c); });
}

// megakernel: title case, shared by the string method and the filter, which differ in where a word
// starts: Python's str.title after any byte that is not a letter ("it'S"), Jinja2's filter after
// whitespace or one of -({[< ("it's").
static std::string title_case(const std::string & s, bool jinja2_filter) {
  return utf8_map(s, [jinja2_filter](int32_t c, size_t i, int32_t prev) {
    bool word_start = i == 0;
    if (!word_start) {
      word_start = jinja2_filter ? (prev >= 0 && prev < 128 && (std::isspace(prev) || (prev != 0 && std::strchr("-({[<", prev) != nullptr)))
                                 : !utf8_is_letter(prev);
    }
    return word_start ? utf8proc_totitle(c) : utf8proc_tolower(c);
  });
}

// megakernel: str.replace / the replace filter, in one pass (in-place replacing was quadratic) and
// bounded; count < 0 replaces every match (Python), 0 none.
static std::string replace_count(const std::string & str, const std::string & before, const std::string & after, int64_t count) {
  if (before.empty()) throw std::runtime_error("replace(): the string to replace must not be empty");
  std::string res;
  size_t pos = 0, found;
  while (count != 0 && (found = str.find(before, pos)) != std::string::npos) {
    res.append(str, pos, found - pos);
    res += after;
    check_string_length(res.size());
    pos = found + before.length();
    if (count > 0) --count;
  }
  res.append(str, pos, std::string::npos);
  check_string_length(res.size());
  return res;
}

static std::string html_escape(const std::string & s) {
  std::string result;
  result.reserve(s.size());
  for (const auto & c : s) {
    switch (c) {
      case '&': result += "&amp;"; break;
      case '<': result += "&lt;"; break;
      case '>': result += "&gt;"; break;
      case '"': result += "&#34;"; break;
      case '\'': result += "&apos;"; break;
      default: result += c; break;
    }
  }
  return result;
}

// megakernel: jinja2's tests that take an argument (`x is divisibleby 3`, `x is in seq`,
// `x is eq y`, `is ne`, `is lt`/`le`/`gt`/`ge` and their symbols, `is equalto`).
class TestExpr : public Expression {
    std::shared_ptr<Expression> left;
    std::string name;
    std::vector<std::shared_ptr<Expression>> args;
    bool negated;
public:
    TestExpr(const Location & loc, std::shared_ptr<Expression> && l, std::string n, std::vector<std::shared_ptr<Expression>> && a, bool neg)
        : Expression(loc), left(std::move(l)), name(std::move(n)), args(std::move(a)), negated(neg) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        auto l = left->evaluate(context);
        if (args.size() != 1) throw std::runtime_error("test '" + name + "' takes one argument");
        // the test is the builtin of that name (Context::builtins: eq, ne, lt, ..., divisibleby, in),
        // the same function select/selectattr call by name
        auto fn = context->get(name);
        if (!fn.is_callable()) throw std::runtime_error("test '" + name + "' with an argument is not supported");
        ArgumentsValue call_args{{l, args[0]->evaluate(context)}, {}};
        const bool r = fn.call(context, call_args).to_bool();
        return negated ? !r : r;
    }
};

class MethodCallExpr : public Expression {
    std::shared_ptr<Expression> object;
    std::shared_ptr<VariableExpr> method;
    ArgumentsExpression args;
public:
    MethodCallExpr(const Location & loc, std::shared_ptr<Expression> && obj, std::shared_ptr<VariableExpr> && m, ArgumentsExpression && a)
        : Expression(loc), object(std::move(obj)), method(std::move(m)), args(std::move(a)) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        if (!object) throw std::runtime_error("MethodCallExpr.object is null");
        if (!method) throw std::runtime_error("MethodCallExpr.method is null");
        auto obj = object->evaluate(context);
        auto vargs = args.evaluate(context);
        if (obj.is_null()) {
          throw std::runtime_error("Trying to call method '" + method->get_name() + "' on null");
        }
        if (obj.is_array()) {
          if (method->get_name() == "append") {
              vargs.expectArgs("append method", {1, 1}, {0, 0});
              obj.push_back(vargs.args[0]);
              return Value();
          } else if (method->get_name() == "pop") {
              vargs.expectArgs("pop method", {0, 1}, {0, 0});
              return obj.pop(vargs.args.empty() ? Value() : vargs.args[0]);
          } else if (method->get_name() == "insert") {
              vargs.expectArgs("insert method", {2, 2}, {0, 0});
              auto index = vargs.args[0].get<int64_t>();
              if (index < 0 || index > (int64_t) obj.size()) throw std::runtime_error("Index out of range for insert method");
              obj.insert(index, vargs.args[1]);
              return Value();
          }
        } else if (obj.is_object()) {
          if (method->get_name() == "items") {
            vargs.expectArgs("items method", {0, 0}, {0, 0});
            auto result = Value::array();
            for (const auto& key : obj.keys()) {
              result.push_back(Value::array({key, obj.at(key)}));
            }
            return result;
          } else if (method->get_name() == "pop") {
            vargs.expectArgs("pop method", {1, 1}, {0, 0});
            return obj.pop(vargs.args[0]);
          } else if (method->get_name() == "keys") {
            vargs.expectArgs("keys method", {0, 0}, {0, 0});
            auto result = Value::array();
            for (const auto& key : obj.keys()) {
              result.push_back(Value(key));
            }
            return result;
          } else if (method->get_name() == "values") {  // megakernel: dict.values()
            vargs.expectArgs("values method", {0, 0}, {0, 0});
            auto result = Value::array();
            for (const auto& key : obj.keys()) {
              result.push_back(obj.at(key));
            }
            return result;
          } else if (method->get_name() == "get") {
            vargs.expectArgs("get method", {1, 2}, {0, 0});
            auto key = vargs.args[0];
            if (vargs.args.size() == 1) {
              return obj.contains(key) ? obj.at(key) : Value();
            } else {
              return obj.contains(key) ? obj.at(key) : vargs.args[1];
            }
          } else if (obj.contains(method->get_name())) {
            auto callable = obj.at(method->get_name());
            if (!callable.is_callable()) {
              throw std::runtime_error("Property '" + method->get_name() + "' is not callable");
            }
            return callable.call(context, vargs);
          }
        } else if (obj.is_string()) {
          auto str = obj.get<std::string>();
          if (method->get_name() == "strip") {
            vargs.expectArgs("strip method", {0, 1}, {0, 0});
            auto chars = vargs.args.empty() ? "" : vargs.args[0].get<std::string>();
            return Value(strip(str, chars));
          } else if (method->get_name() == "lstrip") {
            vargs.expectArgs("lstrip method", {0, 1}, {0, 0});
            auto chars = vargs.args.empty() ? "" : vargs.args[0].get<std::string>();
            return Value(strip(str, chars, /* left= */ true, /* right= */ false));
          } else if (method->get_name() == "rstrip") {
            vargs.expectArgs("rstrip method", {0, 1}, {0, 0});
            auto chars = vargs.args.empty() ? "" : vargs.args[0].get<std::string>();
            return Value(strip(str, chars, /* left= */ false, /* right= */ true));
          } else if (method->get_name() == "split") {
            // megakernel: Python's split(sep=None, maxsplit=-1); upstream needed a separator
            vargs.expectArgs("split method", {0, 2}, {0, 2});
            Value sep = vargs.args.size() > 0 ? vargs.args[0] : vargs.get_named("sep");
            Value maxsplit = vargs.args.size() > 1 ? vargs.args[1] : vargs.get_named("maxsplit");
            const int64_t ms = maxsplit.is_null() ? -1 : maxsplit.get<int64_t>();
            auto parts = sep.is_null() ? split_whitespace(str, ms) : split(str, sep.get<std::string>(), ms);
            Value result = Value::array();
            for (const auto& part : parts) {
              result.push_back(Value(part));
            }
            return result;
          } else if (method->get_name() == "capitalize") {
            vargs.expectArgs("capitalize method", {0, 0}, {0, 0});
            return Value(capitalize(str));
          } else if (method->get_name() == "upper") {
            vargs.expectArgs("upper method", {0, 0}, {0, 0});
            return Value(utf8_upper(str));  // megakernel: beyond ASCII
          } else if (method->get_name() == "lower") {
            vargs.expectArgs("lower method", {0, 0}, {0, 0});
            return Value(utf8_lower(str));  // megakernel: beyond ASCII
          } else if (method->get_name() == "endswith" || method->get_name() == "startswith") {
            // megakernel: a tuple (list) of candidates too, as in Python
            const bool ends = method->get_name() == "endswith";
            vargs.expectArgs(ends ? "endswith method" : "startswith method", {1, 1}, {0, 0});
            auto test = [&](const std::string & a) {
              return a.length() <= str.length() &&
                     (ends ? std::equal(a.rbegin(), a.rend(), str.rbegin()) : std::equal(a.begin(), a.end(), str.begin()));
            };
            if (vargs.args[0].is_array()) {
              for (size_t i = 0; i < vargs.args[0].size(); ++i)
                if (test(vargs.args[0].at(i).get<std::string>())) return true;
              return false;
            }
            return test(vargs.args[0].get<std::string>());
          } else if (method->get_name() == "find") {
            // megakernel: Python's str.find(sub): the code point index of the first match, or -1
            vargs.expectArgs("find method", {1, 1}, {0, 0});
            const size_t at = str.find(vargs.args[0].get<std::string>());
            return at == std::string::npos ? int64_t{-1} : utf8_length(str.substr(0, at));
          } else if (method->get_name() == "count") {
            vargs.expectArgs("count method", {1, 1}, {0, 0});  // megakernel: Python's str.count(sub)
            const std::string sub = vargs.args[0].get<std::string>();
            if (sub.empty()) return utf8_length(str) + 1;
            int64_t n = 0;
            for (size_t at = str.find(sub); at != std::string::npos; at = str.find(sub, at + sub.size())) ++n;
            return n;
          } else if (method->get_name() == "join") {
            vargs.expectArgs("join method", {1, 1}, {0, 0});  // megakernel: Python's sep.join(strings)
            std::string out;
            bool first_item = true;
            vargs.args[0].for_each([&](Value & item) {
              if (!item.is_string()) throw std::runtime_error("join: sequence item is not a string: " + item.dump());
              if (!first_item) out += str;
              first_item = false;
              out += item.get<std::string>();
              check_string_length(out.size());
            });
            return out;
          } else if (method->get_name() == "title") {
            vargs.expectArgs("title method", {0, 0}, {0, 0});
            return Value(title_case(str, /* jinja2_filter= */ false));
          } else if (method->get_name() == "replace") {
            vargs.expectArgs("replace method", {2, 3}, {0, 0});
            return Value(replace_count(str, vargs.args[0].get<std::string>(), vargs.args[1].get<std::string>(),
                                       vargs.args.size() == 3 ? vargs.args[2].get<int64_t>() : -1));
          }
        }
        throw std::runtime_error("Unknown method: " + method->get_name());
    }
};

class CallExpr : public Expression {
public:
    std::shared_ptr<Expression> object;
    ArgumentsExpression args;
    CallExpr(const Location & loc, std::shared_ptr<Expression> && obj, ArgumentsExpression && a)
        : Expression(loc), object(std::move(obj)), args(std::move(a)) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        if (!object) throw std::runtime_error("CallExpr.object is null");
        auto obj = object->evaluate(context);
        if (!obj.is_callable()) {
          throw std::runtime_error("Object is not callable: " + obj.dump(2));
        }
        auto vargs = args.evaluate(context);
        return obj.call(context, vargs);
    }
};

class FilterExpr : public Expression {
    std::vector<std::shared_ptr<Expression>> parts;
public:
    FilterExpr(const Location & loc, std::vector<std::shared_ptr<Expression>> && p)
      : Expression(loc), parts(std::move(p)) {}
    Value do_evaluate(const std::shared_ptr<Context> & context) const override {
        Value result;
        bool first = true;
        for (const auto& part : parts) {
          if (!part) throw std::runtime_error("FilterExpr.part is null");
          if (first) {
            first = false;
            result = part->evaluate(context);
          } else {
            // megakernel: a filter the engine lacks is named ("Value is not callable: null" said neither)
            auto known = [](const Expression* e, const Value& v) {
              if (v.is_callable()) return;
              auto var = dynamic_cast<const VariableExpr*>(e);
              throw std::runtime_error("unknown filter '" + (var ? var->get_name() : std::string("?")) +
                                       "' (this template engine does not have it)");
            };
            if (auto ce = dynamic_cast<CallExpr*>(part.get())) {
              auto target = ce->object->evaluate(context);
              known(ce->object.get(), target);
              ArgumentsValue args = ce->args.evaluate(context);
              args.args.insert(args.args.begin(), result);
              result = target.call(context, args);
            } else {
              auto callable = part->evaluate(context);
              known(part.get(), callable);
              ArgumentsValue args;
              args.args.insert(args.args.begin(), result);
              result = callable.call(context, args);
            }
          }
        }
        return result;
    }

    void prepend(std::shared_ptr<Expression> && e) {
        parts.insert(parts.begin(), std::move(e));
    }
};

class Parser {
private:
    using CharIterator = std::string::const_iterator;

    std::shared_ptr<std::string> template_str;
    CharIterator start, end, it;
    Options options;

    Parser(const std::shared_ptr<std::string>& template_str, const Options & options) : template_str(template_str), options(options) {
      if (!template_str) throw std::runtime_error("Template string is null");
      start = it = this->template_str->begin();
      end = this->template_str->end();
    }

    bool consumeSpaces(SpaceHandling space_handling = SpaceHandling::Strip) {
      if (space_handling == SpaceHandling::Strip) {
        while (it != end && std::isspace(*it)) ++it;
      }
      return true;
    }

    std::unique_ptr<std::string> parseString() {
      auto doParse = [&](char quote) -> std::unique_ptr<std::string> {
        if (it == end || *it != quote) return nullptr;
        std::string result;
        bool escape = false;
        // megakernel: Python's escapes, as jinja2 reads a string literal (unicode-escape): \xhh,
        // \uXXXX, \UXXXXXXXX and octal \ooo are code points written as UTF-8, \a \v \' \" too, a
        // backslash-newline is dropped, and an unknown escape keeps its backslash ('\d' is \d).
        // Upstream dropped the backslash of every other escape ('\u00e9' gave "u00e9").
        auto code_point = [&](int digits, int base) -> uint32_t {
          uint32_t cp = 0;
          int n = 0;
          for (; n < digits && it + 1 != end; ++n) {
            const char c = *(it + 1);
            const int v = (c >= '0' && c <= '9') ? c - '0'
                        : (base == 16 && c >= 'a' && c <= 'f') ? c - 'a' + 10
                        : (base == 16 && c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
            if (v < 0 || v >= base) break;
            cp = cp * static_cast<uint32_t>(base) + static_cast<uint32_t>(v);
            ++it;
          }
          if (base == 16 && n < digits) throw std::runtime_error("truncated \\x, \\u or \\U escape in a string literal");
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
          {
            char hex[16];
            std::snprintf(hex, sizeof hex, "%04X", static_cast<unsigned>(cp));
            throw std::runtime_error(std::string("string escape for U+") + hex + " is not a character UTF-8 can hold");
          }
          return cp;
        };
        auto append_utf8 = [&](uint32_t cp) {
          if (cp < 0x80) {
            result += static_cast<char>(cp);
          } else if (cp < 0x800) {
            result += static_cast<char>(0xC0 | (cp >> 6));
            result += static_cast<char>(0x80 | (cp & 0x3F));
          } else if (cp < 0x10000) {
            result += static_cast<char>(0xE0 | (cp >> 12));
            result += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            result += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            result += static_cast<char>(0xF0 | (cp >> 18));
            result += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            result += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            result += static_cast<char>(0x80 | (cp & 0x3F));
          }
        };
        for (++it; it != end; ++it) {
          if (escape) {
            escape = false;
            switch (*it) {
              case 'n': result += '\n'; break;
              case 'r': result += '\r'; break;
              case 't': result += '\t'; break;
              case 'b': result += '\b'; break;
              case 'f': result += '\f'; break;
              case 'a': result += '\a'; break;
              case 'v': result += '\v'; break;
              case '\\': result += '\\'; break;
              case '\'': result += '\''; break;
              case '"': result += '"'; break;
              case '\n': break;  // a backslash-newline continues the line
              case 'x': append_utf8(code_point(2, 16)); break;
              case 'u': append_utf8(code_point(4, 16)); break;
              case 'U': append_utf8(code_point(8, 16)); break;
              case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7':
                --it;
                append_utf8(code_point(3, 8));
                break;
              default:
                result += '\\';
                result += *it;
                break;
            }
          } else if (*it == '\\') {
            escape = true;
          } else if (*it == quote) {
              ++it;
            return std::make_unique<std::string>(std::move(result));
          } else {
            result += *it;
          }
        }
        return nullptr;
      };

      consumeSpaces();
      if (it == end) return nullptr;
      if (*it == '"') return doParse('"');
      if (*it == '\'') return doParse('\'');
      return nullptr;
    }

    json parseNumber(CharIterator& it, const CharIterator& end) {
        auto before = it;
        consumeSpaces();
        auto start = it;
        bool hasDecimal = false;
        bool hasExponent = false;

        if (it != end && (*it == '-' || *it == '+')) ++it;

        while (it != end) {
          if (std::isdigit(*it)) {
            ++it;
          } else if (*it == '.') {
            if (hasDecimal) throw std::runtime_error("Multiple decimal points");
            hasDecimal = true;
            ++it;
          } else if (it != start && (*it == 'e' || *it == 'E')) {
            if (hasExponent) throw std::runtime_error("Multiple exponents");
            hasExponent = true;
            ++it;
            if (it != end && (*it == '-' || *it == '+')) ++it;  // megakernel: 1e-7, 1.5e+3
          } else {
            break;
          }
        }
        if (start == it) {
          it = before;
          return json(); // No valid characters found
        }

        std::string str(start, it);
        try {
          return json::parse(str);
        } catch (json::parse_error& e) {
          throw std::runtime_error("Failed to parse number: '" + str + "' (" + std::string(e.what()) + ")");
          return json();
        }
    }

    /** integer, float, bool, string */
    std::shared_ptr<Value> parseConstant() {
      auto start = it;
      consumeSpaces();
      if (it == end) return nullptr;
      if (*it == '"' || *it == '\'') {
        auto str = parseString();
        if (str) return std::make_shared<Value>(*str);
      }
      static std::regex prim_tok(R"(true\b|True\b|false\b|False\b|None\b)");
      auto token = consumeToken(prim_tok);
      if (!token.empty()) {
        if (token == "true" || token == "True") return std::make_shared<Value>(true);
        if (token == "false" || token == "False") return std::make_shared<Value>(false);
        if (token == "None") return std::make_shared<Value>(nullptr);
        throw std::runtime_error("Unknown constant token: " + token);
      }

      auto number = parseNumber(it, end);
      if (!number.is_null()) return std::make_shared<Value>(number);

      it = start;
      return nullptr;
    }

    class expression_parsing_error : public std::runtime_error {
        const CharIterator it;
      public:
        expression_parsing_error(const std::string & message, const CharIterator & it)
            : std::runtime_error(message), it(it) {}
        size_t get_pos(const CharIterator & begin) const {
            return std::distance(begin, it);
      }
    };

    bool peekSymbols(const std::vector<std::string> & symbols) const {
        for (const auto & symbol : symbols) {
            if (std::distance(it, end) >= (int64_t) symbol.size() && std::string(it, it + symbol.size()) == symbol) {
                return true;
            }
        }
        return false;
    }

    std::vector<std::string> consumeTokenGroups(const std::regex & regex, SpaceHandling space_handling = SpaceHandling::Strip) {
        auto start = it;
        consumeSpaces(space_handling);
        std::smatch match;
        // megakernel: anchored at `it` (match_continuous): searching the rest of the source for a
        // match and keeping it only at position 0 made parsing quadratic in the source size
        if (std::regex_search(it, end, match, regex, std::regex_constants::match_continuous) && match.position() == 0) {
            it += match[0].length();
            std::vector<std::string> ret;
            for (size_t i = 0, n = match.size(); i < n; ++i) {
                ret.push_back(match[i].str());
            }
            return ret;
        }
        it = start;
        return {};
    }
    std::string consumeToken(const std::regex & regex, SpaceHandling space_handling = SpaceHandling::Strip) {
        auto start = it;
        consumeSpaces(space_handling);
        std::smatch match;
        // megakernel: anchored at `it` (match_continuous): searching the rest of the source for a
        // match and keeping it only at position 0 made parsing quadratic in the source size
        if (std::regex_search(it, end, match, regex, std::regex_constants::match_continuous) && match.position() == 0) {
            it += match[0].length();
            return match[0].str();
        }
        it = start;
        return "";
    }

    std::string consumeToken(const std::string & token, SpaceHandling space_handling = SpaceHandling::Strip) {
        auto start = it;
        consumeSpaces(space_handling);
        if (std::distance(it, end) >= (int64_t) token.size() && std::string(it, it + token.size()) == token) {
            it += token.size();
            return token;
        }
        it = start;
        return "";
    }

    std::shared_ptr<Expression> parseExpression(bool allow_if_expr = true) {
        ParseNestingGuard nesting(false);  // megakernel: the parser's recursion bounded
        auto left = parseLogicalOr();
        if (it == end) return left;

        if (!allow_if_expr) return left;

        static std::regex if_tok(R"(if\b)");
        if (consumeToken(if_tok).empty()) {
          return left;
        }

        auto location = get_location();
        auto [condition, else_expr] = parseIfExpression();
        return std::make_shared<IfExpr>(location, std::move(condition), std::move(left), std::move(else_expr));
    }

    Location get_location() const {
        return {template_str, (size_t) std::distance(start, it)};
    }

    std::pair<std::shared_ptr<Expression>, std::shared_ptr<Expression>> parseIfExpression() {
        auto condition = parseLogicalOr();
        if (!condition) throw std::runtime_error("Expected condition expression");

        static std::regex else_tok(R"(else\b)");
        std::shared_ptr<Expression> else_expr;
        if (!consumeToken(else_tok).empty()) {
          else_expr = parseExpression();
          if (!else_expr) throw std::runtime_error("Expected 'else' expression");
        }
        return std::pair(std::move(condition), std::move(else_expr));
    }

    std::shared_ptr<Expression> parseLogicalOr() {
        auto left = parseLogicalAnd();
        if (!left) throw std::runtime_error("Expected left side of 'logical or' expression");

        static std::regex or_tok(R"(or\b)");
        auto location = get_location();
        while (!consumeToken(or_tok).empty()) {
            auto right = parseLogicalAnd();
            if (!right) throw std::runtime_error("Expected right side of 'or' expression");
            left = std::make_shared<BinaryOpExpr>(location, std::move(left), std::move(right), BinaryOpExpr::Op::Or);
        }
        return left;
    }

    std::shared_ptr<Expression> parseLogicalNot() {
        static std::regex not_tok(R"(not\b)");
        auto location = get_location();

        if (!consumeToken(not_tok).empty()) {
          ParseNestingGuard nesting(false);  // megakernel: `not not not ...` bounded
          auto sub = parseLogicalNot();
          if (!sub) throw std::runtime_error("Expected expression after 'not' keyword");
          return std::make_shared<UnaryOpExpr>(location, std::move(sub), UnaryOpExpr::Op::LogicalNot);
        }
        return parseLogicalCompare();
    }

    std::shared_ptr<Expression> parseLogicalAnd() {
        auto left = parseLogicalNot();
        if (!left) throw std::runtime_error("Expected left side of 'logical and' expression");

        static std::regex and_tok(R"(and\b)");
        auto location = get_location();
        while (!consumeToken(and_tok).empty()) {
            auto right = parseLogicalNot();
            if (!right) throw std::runtime_error("Expected right side of 'and' expression");
            left = std::make_shared<BinaryOpExpr>(location, std::move(left), std::move(right), BinaryOpExpr::Op::And);
        }
        return left;
    }

    std::shared_ptr<Expression> parseLogicalCompare() {
        auto left = parseStringConcat();
        if (!left) throw std::runtime_error("Expected left side of 'logical compare' expression");

        static std::regex compare_tok(R"(==|!=|<=?|>=?|in\b|is\b|not\s+in\b)");
        static std::regex not_tok(R"(not\b)");
        std::string op_str;
        // megakernel: Python chains comparisons: `a < b < c` is `a < b and b < c` (upstream compared
        // the boolean a < b with c); prev_right is b, evaluated once per comparison it is in
        std::shared_ptr<Expression> prev_right;
        while (!(op_str = consumeToken(compare_tok)).empty()) {
            auto location = get_location();
            if (op_str == "is") {
              auto negated = !consumeToken(not_tok).empty();

              auto identifier = parseIdentifier();
              if (!identifier) throw std::runtime_error("Expected identifier after 'is' keyword");

              // megakernel: a test with an argument, as jinja2's parse_test: `is divisibleby(3)`, or one
              // value after the name (`is divisibleby 3`, `is in [1, 2]`, `is eq x`)
              consumeSpaces();
              std::vector<std::shared_ptr<Expression>> test_args;
              if (peekSymbols({ "(" })) {
                auto call = parseCallArgs();
                if (!call.kwargs.empty()) throw std::runtime_error("test '" + identifier->get_name() + "' takes no named arguments");
                test_args = std::move(call.args);
              } else if (it != end) {
                static std::regex stop_words(R"((and|or|else|if|not|is|in)\b)");
                const char c = *it;
                const bool starts_value = c == '\'' || c == '"' || c == '[' || c == '{' || std::isdigit(static_cast<unsigned char>(c)) ||
                                          std::isalpha(static_cast<unsigned char>(c)) || c == '_';
                std::smatch m;
                if (starts_value && !std::regex_search(it, end, m, stop_words, std::regex_constants::match_continuous))
                  test_args.push_back(parseValueExpression());
              }
              if (!test_args.empty())
                return std::make_shared<TestExpr>(left->location, std::move(left), identifier->get_name(), std::move(test_args), negated);

              return std::make_shared<BinaryOpExpr>(
                  left->location,
                  std::move(left), std::move(identifier),
                  negated ? BinaryOpExpr::Op::IsNot : BinaryOpExpr::Op::Is);
            }
            auto right = parseStringConcat();
            if (!right) throw std::runtime_error("Expected right side of 'logical compare' expression");
            BinaryOpExpr::Op op;
            if (op_str == "==") op = BinaryOpExpr::Op::Eq;
            else if (op_str == "!=") op = BinaryOpExpr::Op::Ne;
            else if (op_str == "<") op = BinaryOpExpr::Op::Lt;
            else if (op_str == ">") op = BinaryOpExpr::Op::Gt;
            else if (op_str == "<=") op = BinaryOpExpr::Op::Le;
            else if (op_str == ">=") op = BinaryOpExpr::Op::Ge;
            else if (op_str == "in") op = BinaryOpExpr::Op::In;
            else if (op_str.substr(0, 3) == "not") op = BinaryOpExpr::Op::NotIn;
            else throw std::runtime_error("Unknown comparison operator: " + op_str);
            if (prev_right) {
              auto next = std::make_shared<BinaryOpExpr>(get_location(), std::shared_ptr<Expression>(prev_right),
                                                         std::shared_ptr<Expression>(right), op);
              left = std::make_shared<BinaryOpExpr>(get_location(), std::move(left), std::move(next), BinaryOpExpr::Op::And);
            } else {
              left = std::make_shared<BinaryOpExpr>(get_location(), std::move(left), std::shared_ptr<Expression>(right), op);
            }
            prev_right = right;
        }
        return left;
    }

    Expression::Parameters parseParameters() {
        consumeSpaces();
        if (consumeToken("(").empty()) throw std::runtime_error("Expected opening parenthesis in param list");

        Expression::Parameters result;

        while (it != end) {
            if (!consumeToken(")").empty()) {
                return result;
            }
            auto expr = parseExpression();
            if (!expr) throw std::runtime_error("Expected expression in call args");

            if (auto ident = dynamic_cast<VariableExpr*>(expr.get())) {
                if (!consumeToken("=").empty()) {
                    auto value = parseExpression();
                    if (!value) throw std::runtime_error("Expected expression in for named arg");
                    result.emplace_back(ident->get_name(), std::move(value));
                } else {
                    result.emplace_back(ident->get_name(), nullptr);
                }
            } else {
                result.emplace_back(std::string(), std::move(expr));
            }
            if (consumeToken(",").empty()) {
              if (consumeToken(")").empty()) {
                throw std::runtime_error("Expected closing parenthesis in call args");
              }
              return result;
            }
        }
        throw std::runtime_error("Expected closing parenthesis in call args");
    }

    ArgumentsExpression parseCallArgs() {
        consumeSpaces();
        if (consumeToken("(").empty()) throw std::runtime_error("Expected opening parenthesis in call args");

        ArgumentsExpression result;

        while (it != end) {
            if (!consumeToken(")").empty()) {
                return result;
            }
            auto expr = parseExpression();
            if (!expr) throw std::runtime_error("Expected expression in call args");

            if (auto ident = dynamic_cast<VariableExpr*>(expr.get())) {
                if (!consumeToken("=").empty()) {
                    auto value = parseExpression();
                    if (!value) throw std::runtime_error("Expected expression in for named arg");
                    result.kwargs.emplace_back(ident->get_name(), std::move(value));
                } else {
                    result.args.emplace_back(std::move(expr));
                }
            } else {
                result.args.emplace_back(std::move(expr));
            }
            if (consumeToken(",").empty()) {
              if (consumeToken(")").empty()) {
                throw std::runtime_error("Expected closing parenthesis in call args");
              }
              return result;
            }
        }
        throw std::runtime_error("Expected closing parenthesis in call args");
    }

    std::shared_ptr<VariableExpr> parseIdentifier() {
        static std::regex ident_regex(R"((?!(?:not|is|and|or|del)\b)[a-zA-Z_]\w*)");
        auto location = get_location();
        auto ident = consumeToken(ident_regex);
        if (ident.empty())
          return nullptr;
        return std::make_shared<VariableExpr>(location, ident);
    }

    std::shared_ptr<Expression> parseStringConcat() {
        auto left = parseMathPow();
        if (!left) throw std::runtime_error("Expected left side of 'string concat' expression");

        static std::regex concat_tok(R"(~(?!\}))");
        if (!consumeToken(concat_tok).empty()) {
            auto right = parseLogicalAnd();
            if (!right) throw std::runtime_error("Expected right side of 'string concat' expression");
            left = std::make_shared<BinaryOpExpr>(get_location(), std::move(left), std::move(right), BinaryOpExpr::Op::StrConcat);
        }
        return left;
    }

    std::shared_ptr<Expression> parseMathPow() {
        auto left = parseMathPlusMinus();
        if (!left) throw std::runtime_error("Expected left side of 'math pow' expression");

        while (!consumeToken("**").empty()) {
            auto right = parseMathPlusMinus();
            if (!right) throw std::runtime_error("Expected right side of 'math pow' expression");
            left = std::make_shared<BinaryOpExpr>(get_location(), std::move(left), std::move(right), BinaryOpExpr::Op::MulMul);
        }
        return left;
    }

    std::shared_ptr<Expression> parseMathPlusMinus() {
        static std::regex plus_minus_tok(R"(\+|-(?![}%#]\}))");

        auto left = parseMathMulDiv();
        if (!left) throw std::runtime_error("Expected left side of 'math plus/minus' expression");
        std::string op_str;
        while (!(op_str = consumeToken(plus_minus_tok)).empty()) {
            auto right = parseMathMulDiv();
            if (!right) throw std::runtime_error("Expected right side of 'math plus/minus' expression");
            auto op = op_str == "+" ? BinaryOpExpr::Op::Add : BinaryOpExpr::Op::Sub;
            left = std::make_shared<BinaryOpExpr>(get_location(), std::move(left), std::move(right), op);
        }
        return left;
    }

    std::shared_ptr<Expression> parseMathMulDiv() {
        auto left = parseMathUnaryPlusMinus();
        if (!left) throw std::runtime_error("Expected left side of 'math mul/div' expression");

        static std::regex mul_div_tok(R"(\*\*?|//?|%(?!\}))");
        std::string op_str;
        while (!(op_str = consumeToken(mul_div_tok)).empty()) {
            auto right = parseMathUnaryPlusMinus();
            if (!right) throw std::runtime_error("Expected right side of 'math mul/div' expression");
            auto op = op_str == "*" ? BinaryOpExpr::Op::Mul
                : op_str == "**" ? BinaryOpExpr::Op::MulMul
                : op_str == "/" ? BinaryOpExpr::Op::Div
                : op_str == "//" ? BinaryOpExpr::Op::DivDiv
                : BinaryOpExpr::Op::Mod;
            left = std::make_shared<BinaryOpExpr>(get_location(), std::move(left), std::move(right), op);
        }

        if (!consumeToken("|").empty()) {
            auto expr = parseMathMulDiv();
            if (auto filter = dynamic_cast<FilterExpr*>(expr.get())) {
                filter->prepend(std::move(left));
                return expr;
            } else {
                std::vector<std::shared_ptr<Expression>> parts;
                parts.emplace_back(std::move(left));
                parts.emplace_back(std::move(expr));
                return std::make_shared<FilterExpr>(get_location(), std::move(parts));
            }
        }
        return left;
    }

    std::shared_ptr<Expression> call_func(const std::string & name, ArgumentsExpression && args) const {
        return std::make_shared<CallExpr>(get_location(), std::make_shared<VariableExpr>(get_location(), name), std::move(args));
    }

    std::shared_ptr<Expression> parseMathUnaryPlusMinus() {
        static std::regex unary_plus_minus_tok(R"(\+|-(?![}%#]\}))");
        auto op_str = consumeToken(unary_plus_minus_tok);
        auto expr = parseExpansion();
        if (!expr) throw std::runtime_error("Expected expr of 'unary plus/minus/expansion' expression");

        if (!op_str.empty()) {
            auto op = op_str == "+" ? UnaryOpExpr::Op::Plus : UnaryOpExpr::Op::Minus;
            return std::make_shared<UnaryOpExpr>(get_location(), std::move(expr), op);
        }
        return expr;
    }

    std::shared_ptr<Expression> parseExpansion() {
      static std::regex expansion_tok(R"(\*\*?)");
      auto op_str = consumeToken(expansion_tok);
      auto expr = parseValueExpression();
      if (op_str.empty()) return expr;
      if (!expr) throw std::runtime_error("Expected expr of 'expansion' expression");
      return std::make_shared<UnaryOpExpr>(get_location(), std::move(expr), op_str == "*" ? UnaryOpExpr::Op::Expansion : UnaryOpExpr::Op::ExpansionDict);
    }

    std::shared_ptr<Expression> parseValueExpression() {
      auto parseValue = [&]() -> std::shared_ptr<Expression> {
        auto location = get_location();
        auto constant = parseConstant();
        if (constant) return std::make_shared<LiteralExpr>(location, *constant);

        static std::regex null_regex(R"(null\b)");
        if (!consumeToken(null_regex).empty()) return std::make_shared<LiteralExpr>(location, Value());

        auto identifier = parseIdentifier();
        if (identifier) return identifier;

        auto braced = parseBracedExpressionOrArray();
        if (braced) return braced;

        auto array = parseArray();
        if (array) return array;

        auto dictionary = parseDictionary();
        if (dictionary) return dictionary;

        throw std::runtime_error("Expected value expression");
      };

      auto value = parseValue();

      while (it != end && consumeSpaces() && peekSymbols({ "[", "." })) {
        if (!consumeToken("[").empty()) {
          std::shared_ptr<Expression> index;
          auto slice_loc = get_location();
          std::shared_ptr<Expression> start, end, step;
          bool has_first_colon = false, has_second_colon = false;

          if (!peekSymbols({ ":" })) {
            start = parseExpression();
          }

          if (!consumeToken(":").empty()) {
            has_first_colon = true;
            if (!peekSymbols({ ":", "]" })) {
              end = parseExpression();
            }
            if (!consumeToken(":").empty()) {
              has_second_colon = true;
              if (!peekSymbols({ "]" })) {
                step = parseExpression();
              }
            }
          }

          if ((has_first_colon || has_second_colon)) {
            index = std::make_shared<SliceExpr>(slice_loc, std::move(start), std::move(end), std::move(step));
          } else {
            index = std::move(start);
          }
          if (!index) throw std::runtime_error("Empty index in subscript");
          if (consumeToken("]").empty()) throw std::runtime_error("Expected closing bracket in subscript");

          value = std::make_shared<SubscriptExpr>(value->location, std::move(value), std::move(index));
        } else if (!consumeToken(".").empty()) {
            auto identifier = parseIdentifier();
            if (!identifier) throw std::runtime_error("Expected identifier in subscript");

            consumeSpaces();
            if (peekSymbols({ "(" })) {
              auto callParams = parseCallArgs();
              value = std::make_shared<MethodCallExpr>(identifier->location, std::move(value), std::move(identifier), std::move(callParams));
            } else {
              auto key = std::make_shared<LiteralExpr>(identifier->location, Value(identifier->get_name()));
              value = std::make_shared<SubscriptExpr>(identifier->location, std::move(value), std::move(key));
            }
        }
        consumeSpaces();
      }

      if (peekSymbols({ "(" })) {
        auto location = get_location();
        auto callParams = parseCallArgs();
        value = std::make_shared<CallExpr>(location, std::move(value), std::move(callParams));
      }
      return value;
    }

    std::shared_ptr<Expression> parseBracedExpressionOrArray() {
        if (consumeToken("(").empty()) return nullptr;

        auto expr = parseExpression();
        if (!expr) throw std::runtime_error("Expected expression in braced expression");

        if (!consumeToken(")").empty()) {
            return expr;  // Drop the parentheses
        }

        std::vector<std::shared_ptr<Expression>> tuple;
        tuple.emplace_back(std::move(expr));

        while (it != end) {
          if (consumeToken(",").empty()) throw std::runtime_error("Expected comma in tuple");
          auto next = parseExpression();
          if (!next) throw std::runtime_error("Expected expression in tuple");
          tuple.push_back(std::move(next));

          if (!consumeToken(")").empty()) {
              return std::make_shared<ArrayExpr>(get_location(), std::move(tuple));
          }
        }
        throw std::runtime_error("Expected closing parenthesis");
    }

    std::shared_ptr<Expression> parseArray() {
        if (consumeToken("[").empty()) return nullptr;

        std::vector<std::shared_ptr<Expression>> elements;
        if (!consumeToken("]").empty()) {
            return std::make_shared<ArrayExpr>(get_location(), std::move(elements));
        }
        auto first_expr = parseExpression();
        if (!first_expr) throw std::runtime_error("Expected first expression in array");
        elements.push_back(std::move(first_expr));

        while (it != end) {
            if (!consumeToken(",").empty()) {
              auto expr = parseExpression();
              if (!expr) throw std::runtime_error("Expected expression in array");
              elements.push_back(std::move(expr));
            } else if (!consumeToken("]").empty()) {
                return std::make_shared<ArrayExpr>(get_location(), std::move(elements));
            } else {
                throw std::runtime_error("Expected comma or closing bracket in array");
            }
        }
        throw std::runtime_error("Expected closing bracket");
    }

    std::shared_ptr<Expression> parseDictionary() {
        if (consumeToken("{").empty()) return nullptr;

        std::vector<std::pair<std::shared_ptr<Expression>, std::shared_ptr<Expression>>> elements;
        if (!consumeToken("}").empty()) {
            return std::make_shared<DictExpr>(get_location(), std::move(elements));
        }

        auto parseKeyValuePair = [&]() {
            auto key = parseExpression();
            if (!key) throw std::runtime_error("Expected key in dictionary");
            if (consumeToken(":").empty()) throw std::runtime_error("Expected colon betweek key & value in dictionary");
            auto value = parseExpression();
            if (!value) throw std::runtime_error("Expected value in dictionary");
            elements.emplace_back(std::pair(std::move(key), std::move(value)));
        };

        parseKeyValuePair();

        while (it != end) {
            if (!consumeToken(",").empty()) {
                parseKeyValuePair();
            } else if (!consumeToken("}").empty()) {
                return std::make_shared<DictExpr>(get_location(), std::move(elements));
            } else {
                throw std::runtime_error("Expected comma or closing brace in dictionary");
            }
        }
        throw std::runtime_error("Expected closing brace");
    }

    SpaceHandling parsePreSpace(const std::string& s) const {
        if (s == "-")
          return SpaceHandling::Strip;
        return SpaceHandling::Keep;
    }

    SpaceHandling parsePostSpace(const std::string& s) const {
        if (s == "-") return SpaceHandling::Strip;
        return SpaceHandling::Keep;
    }

    using TemplateTokenVector = std::vector<std::unique_ptr<TemplateToken>>;
    using TemplateTokenIterator = TemplateTokenVector::const_iterator;

    std::vector<std::string> parseVarNames() {
      static std::regex varnames_regex(R"(((?:\w+)(?:\s*,\s*(?:\w+))*)\s*)");

      std::vector<std::string> group;
      if ((group = consumeTokenGroups(varnames_regex)).empty()) throw std::runtime_error("Expected variable names");
      std::vector<std::string> varnames;
      std::istringstream iss(group[1]);
      std::string varname;
      while (std::getline(iss, varname, ',')) {
        varnames.push_back(strip(varname));
      }
      return varnames;
    }

    std::runtime_error unexpected(const TemplateToken & token) const {
      return std::runtime_error("Unexpected " + TemplateToken::typeToString(token.type)
        + error_location_suffix(*template_str, token.location.pos));
    }
    std::runtime_error unterminated(const TemplateToken & token) const {
      return std::runtime_error("Unterminated " + TemplateToken::typeToString(token.type)
        + error_location_suffix(*template_str, token.location.pos));
    }

    TemplateTokenVector tokenize() {
      static std::regex comment_tok(R"(\{#([-~]?)([\s\S]*?)([-~]?)#\})");
      static std::regex expr_open_regex(R"(\{\{([-~])?)");
      static std::regex block_open_regex(R"(^\{%([-~])?\s*)");
      static std::regex block_keyword_tok(R"((if|else|elif|endif|for|endfor|generation|endgeneration|set|endset|block|endblock|macro|endmacro|filter|endfilter|break|continue)\b)");
      static std::regex non_text_open_regex(R"(\{\{|\{%|\{#)");
      static std::regex expr_close_regex(R"(\s*([-~])?\}\})");
      static std::regex block_close_regex(R"(\s*([-~])?%\})");

      TemplateTokenVector tokens;
      std::vector<std::string> group;
      std::string text;
      std::smatch match;

      try {
        while (it != end) {
          auto location = get_location();

          if (!(group = consumeTokenGroups(comment_tok, SpaceHandling::Keep)).empty()) {
            auto pre_space = parsePreSpace(group[1]);
            auto content = group[2];
            auto post_space = parsePostSpace(group[3]);
            tokens.push_back(std::make_unique<CommentTemplateToken>(location, pre_space, post_space, content));
          } else if (!(group = consumeTokenGroups(expr_open_regex, SpaceHandling::Keep)).empty()) {
            auto pre_space = parsePreSpace(group[1]);
            auto expr = parseExpression();

            if ((group = consumeTokenGroups(expr_close_regex)).empty()) {
              throw std::runtime_error("Expected closing expression tag");
            }

            auto post_space = parsePostSpace(group[1]);
            tokens.push_back(std::make_unique<ExpressionTemplateToken>(location, pre_space, post_space, std::move(expr)));
          } else if (!(group = consumeTokenGroups(block_open_regex, SpaceHandling::Keep)).empty()) {
            auto pre_space = parsePreSpace(group[1]);

            std::string keyword;

            auto parseBlockClose = [&]() -> SpaceHandling {
              if ((group = consumeTokenGroups(block_close_regex)).empty()) throw std::runtime_error("Expected closing block tag");
              return parsePostSpace(group[1]);
            };

            if ((keyword = consumeToken(block_keyword_tok)).empty()) throw std::runtime_error("Expected block keyword");

            if (keyword == "if") {
              auto condition = parseExpression();
              if (!condition) throw std::runtime_error("Expected condition in if block");

              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<IfTemplateToken>(location, pre_space, post_space, std::move(condition)));
            } else if (keyword == "elif") {
              auto condition = parseExpression();
              if (!condition) throw std::runtime_error("Expected condition in elif block");

              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<ElifTemplateToken>(location, pre_space, post_space, std::move(condition)));
            } else if (keyword == "else") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<ElseTemplateToken>(location, pre_space, post_space));
            } else if (keyword == "endif") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<EndIfTemplateToken>(location, pre_space, post_space));
            } else if (keyword == "for") {
              static std::regex recursive_tok(R"(recursive\b)");
              static std::regex if_tok(R"(if\b)");

              auto varnames = parseVarNames();
              static std::regex in_tok(R"(in\b)");
              if (consumeToken(in_tok).empty()) throw std::runtime_error("Expected 'in' keyword in for block");
              auto iterable = parseExpression(/* allow_if_expr = */ false);
              if (!iterable) throw std::runtime_error("Expected iterable in for block");

              std::shared_ptr<Expression> condition;
              if (!consumeToken(if_tok).empty()) {
                condition = parseExpression();
              }
              auto recursive = !consumeToken(recursive_tok).empty();

              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<ForTemplateToken>(location, pre_space, post_space, std::move(varnames), std::move(iterable), std::move(condition), recursive));
            } else if (keyword == "endfor") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<EndForTemplateToken>(location, pre_space, post_space));
            } else if (keyword == "generation") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<GenerationTemplateToken>(location, pre_space, post_space));
            } else if (keyword == "endgeneration") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<EndGenerationTemplateToken>(location, pre_space, post_space));
            } else if (keyword == "set") {
              static std::regex namespaced_var_regex(R"((\w+)\s*\.\s*(\w+))");

              std::string ns;
              std::vector<std::string> var_names;
              std::shared_ptr<Expression> value;
              if (!(group = consumeTokenGroups(namespaced_var_regex)).empty()) {
                ns = group[1];
                var_names.push_back(group[2]);

                if (consumeToken("=").empty()) throw std::runtime_error("Expected equals sign in set block");

                value = parseExpression();
                if (!value) throw std::runtime_error("Expected value in set block");
              } else {
                var_names = parseVarNames();

                if (!consumeToken("=").empty()) {
                  value = parseExpression();
                  if (!value) throw std::runtime_error("Expected value in set block");
                }
              }
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<SetTemplateToken>(location, pre_space, post_space, ns, var_names, std::move(value)));
            } else if (keyword == "endset") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<EndSetTemplateToken>(location, pre_space, post_space));
            } else if (keyword == "macro") {
              auto macroname = parseIdentifier();
              if (!macroname) throw std::runtime_error("Expected macro name in macro block");
              auto params = parseParameters();

              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<MacroTemplateToken>(location, pre_space, post_space, std::move(macroname), std::move(params)));
            } else if (keyword == "endmacro") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<EndMacroTemplateToken>(location, pre_space, post_space));
            } else if (keyword == "filter") {
              auto filter = parseExpression();
              if (!filter) throw std::runtime_error("Expected expression in filter block");

              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<FilterTemplateToken>(location, pre_space, post_space, std::move(filter)));
            } else if (keyword == "endfilter") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<EndFilterTemplateToken>(location, pre_space, post_space));
            } else if (keyword == "break" || keyword == "continue") {
              auto post_space = parseBlockClose();
              tokens.push_back(std::make_unique<LoopControlTemplateToken>(location, pre_space, post_space, keyword == "break" ? LoopControlType::Break : LoopControlType::Continue));
            } else {
              throw std::runtime_error("Unexpected block: " + keyword);
            }
          } else if (std::regex_search(it, end, match, non_text_open_regex)) {
            if (!match.position()) {
                if (match[0] != "{#")
                    throw std::runtime_error("Internal error: Expected a comment");
                throw std::runtime_error("Missing end of comment tag");
            }
            auto text_end = it + match.position();
            text = std::string(it, text_end);
            it = text_end;
            tokens.push_back(std::make_unique<TextTemplateToken>(location, SpaceHandling::Keep, SpaceHandling::Keep, text));
          } else {
            text = std::string(it, end);
            it = end;
            tokens.push_back(std::make_unique<TextTemplateToken>(location, SpaceHandling::Keep, SpaceHandling::Keep, text));
          }
        }
        return tokens;
      } catch (const std::exception & e) {
        throw std::runtime_error(e.what() + error_location_suffix(*template_str, std::distance(start, it)));
      }
    }

    std::shared_ptr<TemplateNode> parseTemplate(
          const TemplateTokenIterator & begin,
          TemplateTokenIterator & it,
          const TemplateTokenIterator & end,
          bool fully = false) const {
        ParseNestingGuard nesting(true);  // megakernel: nested blocks bounded
        std::vector<std::shared_ptr<TemplateNode>> children;
        while (it != end) {
          const auto start = it;
          const auto & token = *(it++);
          if (auto if_token = dynamic_cast<IfTemplateToken*>(token.get())) {
              std::vector<std::pair<std::shared_ptr<Expression>, std::shared_ptr<TemplateNode>>> cascade;
              cascade.emplace_back(std::move(if_token->condition), parseTemplate(begin, it, end));

              while (it != end && (*it)->type == TemplateToken::Type::Elif) {
                  auto elif_token = dynamic_cast<ElifTemplateToken*>((*(it++)).get());
                  cascade.emplace_back(std::move(elif_token->condition), parseTemplate(begin, it, end));
              }

              if (it != end && (*it)->type == TemplateToken::Type::Else) {
                cascade.emplace_back(nullptr, parseTemplate(begin, ++it, end));
              }
              if (it == end || (*(it++))->type != TemplateToken::Type::EndIf) {
                  throw unterminated(**start);
              }
              children.emplace_back(std::make_shared<IfNode>(token->location, std::move(cascade)));
          } else if (auto for_token = dynamic_cast<ForTemplateToken*>(token.get())) {
              auto body = parseTemplate(begin, it, end);
              auto else_body = std::shared_ptr<TemplateNode>();
              if (it != end && (*it)->type == TemplateToken::Type::Else) {
                else_body = parseTemplate(begin, ++it, end);
              }
              if (it == end || (*(it++))->type != TemplateToken::Type::EndFor) {
                  throw unterminated(**start);
              }
              children.emplace_back(std::make_shared<ForNode>(token->location, std::move(for_token->var_names), std::move(for_token->iterable), std::move(for_token->condition), std::move(body), for_token->recursive, std::move(else_body)));
          } else if (dynamic_cast<GenerationTemplateToken*>(token.get())) {
              auto body = parseTemplate(begin, it, end);
              if (it == end || (*(it++))->type != TemplateToken::Type::EndGeneration) {
                  throw unterminated(**start);
              }
              // Treat as a no-op, as our scope is templates for inference, not training (`{% generation %}` wraps generated tokens for masking).
              children.emplace_back(std::move(body));
          } else if (auto text_token = dynamic_cast<TextTemplateToken*>(token.get())) {
              SpaceHandling pre_space = (it - 1) != begin ? (*(it - 2))->post_space : SpaceHandling::Keep;
              SpaceHandling post_space = it != end ? (*it)->pre_space : SpaceHandling::Keep;

              auto text = text_token->text;
              if (post_space == SpaceHandling::Strip) {
                static std::regex trailing_space_regex(R"(\s+$)");
                text = std::regex_replace(text, trailing_space_regex, "");
              } else if (options.lstrip_blocks && it != end && !dynamic_cast<ExpressionTemplateToken*>((*it).get())) {
                // megakernel: as jinja2, lstrip_blocks strips before {% %} and {# #} only, not {{ }}
                auto i = text.size();
                while (i > 0 && (text[i - 1] == ' ' || text[i - 1] == '\t')) i--;
                if ((i == 0 && (it - 1) == begin) || (i > 0 && text[i - 1] == '\n')) {
                  text.resize(i);
                }
              }
              if (pre_space == SpaceHandling::Strip) {
                static std::regex leading_space_regex(R"(^\s+)");
                text = std::regex_replace(text, leading_space_regex, "");
              } else if (options.trim_blocks && (it - 1) != begin && !dynamic_cast<ExpressionTemplateToken*>((*(it - 2)).get())) {
                if (!text.empty() && text[0] == '\n') {
                  text.erase(0, 1);
                }
              }
              if (it == end && !options.keep_trailing_newline) {
                auto i = text.size();
                if (i > 0 && text[i - 1] == '\n') {
                  i--;
                  if (i > 0 && text[i - 1] == '\r') i--;
                  text.resize(i);
                }
              }
              children.emplace_back(std::make_shared<TextNode>(token->location, text));
          } else if (auto expr_token = dynamic_cast<ExpressionTemplateToken*>(token.get())) {
              children.emplace_back(std::make_shared<ExpressionNode>(token->location, std::move(expr_token->expr)));
          } else if (auto set_token = dynamic_cast<SetTemplateToken*>(token.get())) {
            if (set_token->value) {
              children.emplace_back(std::make_shared<SetNode>(token->location, set_token->ns, set_token->var_names, std::move(set_token->value)));
            } else {
              auto value_template = parseTemplate(begin, it, end);
              if (it == end || (*(it++))->type != TemplateToken::Type::EndSet) {
                  throw unterminated(**start);
              }
              if (!set_token->ns.empty()) throw std::runtime_error("Namespaced set not supported in set with template value");
              if (set_token->var_names.size() != 1) throw std::runtime_error("Structural assignment not supported in set with template value");
              auto & name = set_token->var_names[0];
              children.emplace_back(std::make_shared<SetTemplateNode>(token->location, name, std::move(value_template)));
            }
          } else if (auto macro_token = dynamic_cast<MacroTemplateToken*>(token.get())) {
              auto body = parseTemplate(begin, it, end);
              if (it == end || (*(it++))->type != TemplateToken::Type::EndMacro) {
                  throw unterminated(**start);
              }
              children.emplace_back(std::make_shared<MacroNode>(token->location, std::move(macro_token->name), std::move(macro_token->params), std::move(body)));
          } else if (auto filter_token = dynamic_cast<FilterTemplateToken*>(token.get())) {
              auto body = parseTemplate(begin, it, end);
              if (it == end || (*(it++))->type != TemplateToken::Type::EndFilter) {
                  throw unterminated(**start);
              }
              children.emplace_back(std::make_shared<FilterNode>(token->location, std::move(filter_token->filter), std::move(body)));
          } else if (dynamic_cast<CommentTemplateToken*>(token.get())) {
              // Ignore comments
          } else if (auto ctrl_token = dynamic_cast<LoopControlTemplateToken*>(token.get())) {
              children.emplace_back(std::make_shared<LoopControlNode>(token->location, ctrl_token->control_type));
          } else if (dynamic_cast<EndForTemplateToken*>(token.get())
                  || dynamic_cast<EndSetTemplateToken*>(token.get())
                  || dynamic_cast<EndMacroTemplateToken*>(token.get())
                  || dynamic_cast<EndFilterTemplateToken*>(token.get())
                  || dynamic_cast<EndIfTemplateToken*>(token.get())
                  || dynamic_cast<ElseTemplateToken*>(token.get())
                  || dynamic_cast<EndGenerationTemplateToken*>(token.get())
                  || dynamic_cast<ElifTemplateToken*>(token.get())) {
              it--;  // unconsume the token
              break;  // exit the loop
          } else {
              throw unexpected(**(it-1));
          }
        }
        if (fully && it != end) {
            throw unexpected(**it);
        }
        if (children.empty()) {
          return std::make_shared<TextNode>(Location { template_str, 0 }, std::string());
        } else if (children.size() == 1) {
          return std::move(children[0]);
        } else {
          return std::make_shared<SequenceNode>(children[0]->location(), std::move(children));
        }
    }

public:

    static std::shared_ptr<TemplateNode> parse(const std::string& template_str, const Options & options) {
        // megakernel: nesting and node counts of this parse (restored on exit)
        ParseBudget budget;
        struct Scope { ParseBudget * saved; ~Scope() { parse_budget = saved; } } scope{parse_budget};
        parse_budget = &budget;
        Parser parser(std::make_shared<std::string>(normalize_newlines(template_str)), options);
        auto tokens = parser.tokenize();
        TemplateTokenIterator begin = tokens.begin();
        auto it = begin;
        TemplateTokenIterator end = tokens.end();
        return parser.parseTemplate(begin, it, end, /* fully= */ true);
    }
};

static Value simple_function(const std::string & fn_name, const std::vector<std::string> & params, const std::function<Value(const std::shared_ptr<Context> &, Value & args)> & fn) {
  std::map<std::string, size_t> named_positions;
  for (size_t i = 0, n = params.size(); i < n; i++) named_positions[params[i]] = i;

  return Value::callable([=](const std::shared_ptr<Context> & context, ArgumentsValue & args) -> Value {
    auto args_obj = Value::object();
    std::vector<bool> provided_args(params.size());
    for (size_t i = 0, n = args.args.size(); i < n; i++) {
      auto & arg = args.args[i];
      if (i < params.size()) {
        args_obj.set(params[i], arg);
        provided_args[i] = true;
      } else {
        throw std::runtime_error("Too many positional params for " + fn_name);
      }
    }
    for (auto & [name, value] : args.kwargs) {
      auto named_pos_it = named_positions.find(name);
      if (named_pos_it == named_positions.end()) {
        throw std::runtime_error("Unknown argument " + name + " for function " + fn_name);
      }
      provided_args[named_pos_it->second] = true;
      args_obj.set(name, value);
    }
    return fn(context, args_obj);
  });
}

inline std::shared_ptr<Context> Context::builtins() {
  auto globals = Value::object();

  globals.set("raise_exception", simple_function("raise_exception", { "message" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    throw std::runtime_error(args.at("message").get<std::string>());
  }));
  globals.set("tojson", simple_function("tojson", { "value", "indent", "separators", "ensure_ascii", "sort_keys" }, [](const std::shared_ptr<Context> &, Value & args) {
    // megakernel: HF's tojson also takes json.dumps' separators (e.g. (',', ':')), ensure_ascii and
    // sort_keys
    const Value iv = args.contains("indent") ? args.at("indent") : Value();
    if (!iv.is_null() && !iv.is_number_integer()) throw std::runtime_error("tojson: indent must be an integer");
    const int indent = iv.is_null() ? -1 : static_cast<int>(std::clamp<int64_t>(iv.get<int64_t>(), -1, 64));
    Value::JsonStyle style;
    if (args.contains("separators") && !args.at("separators").is_null()) {
      auto & sv = args.at("separators");
      if (!sv.is_array() || sv.size() != 2 || !sv.at(0).is_string() || !sv.at(1).is_string())
        throw std::runtime_error("tojson: separators must be a pair of strings");
      style.custom_seps = true;
      style.item_sep = sv.at(0).get<std::string>();
      style.key_sep = sv.at(1).get<std::string>();
    }
    style.ensure_ascii = args.contains("ensure_ascii") && args.at("ensure_ascii").to_bool();
    style.sort_keys = args.contains("sort_keys") && args.at("sort_keys").to_bool();
    return Value(args.at("value").dump_json(indent, style));
  }));
  globals.set("items", simple_function("items", { "object" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto items = Value::array();
    if (args.contains("object")) {
      auto & obj = args.at("object");
      if (!obj.is_object()) {
        throw std::runtime_error("Can only get item pairs from a mapping");
      }
      for (auto & key : obj.keys()) {
        items.push_back(Value::array({key, obj.at(key)}));
      }
    }
    return items;
  }));
  globals.set("last", simple_function("last", { "items" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto items = args.at("items");
    if (!items.is_array()) throw std::runtime_error("object is not a list");
    if (items.empty()) return Value();
    return items.at(items.size() - 1);
  }));
  // megakernel: jinja2 filters upstream lacked (new-user trial 36), with jinja2 3.1's rules.
  globals.set("first", simple_function("first", { "items" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    auto items = args.at("items");
    if (items.is_string()) return items.get(Value(int64_t{0}));
    if (!items.is_array()) throw std::runtime_error("first: object is not a list or string");
    if (items.empty()) return Value();
    return items.at(0);
  }));
  globals.set("float", simple_function("float", { "value", "default" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    auto & v = args.at("value");
    const Value def = args.contains("default") ? args.at("default") : Value(0.0);
    if (v.is_number()) return v.get<double>();
    if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
    if (v.is_string()) {
      const std::string t = strip(v.get<std::string>());
      char * end = nullptr;
      errno = 0;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end == t.c_str() + t.size()) return d;
    }
    return def;
  }));
  globals.set("abs", simple_function("abs", { "value" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    auto & v = args.at("value");
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if (i == std::numeric_limits<int64_t>::min()) throw std::runtime_error("abs: integer overflows");
      return i < 0 ? -i : i;
    }
    return std::fabs(v.get<double>());
  }));
  auto pick = [](Value & args, const char * name, bool want_max) -> Value {
    auto & items = args.at("value");
    if (!items.is_array()) throw std::runtime_error(std::string(name) + ": object is not a list");
    const Value attr = args.contains("attribute") ? args.at("attribute") : Value();
    auto key = [&](const Value & x) { return attr.is_null() ? x : Value(x).get(attr); };
    Value best;
    for (size_t i = 0; i < items.size(); ++i) {
      const Value x = items.at(i);
      if (best.is_null() || (want_max ? key(best) < key(x) : key(x) < key(best))) best = x;
    }
    return best;
  };
  globals.set("max", simple_function("max", { "value", "case_sensitive", "attribute" }, [pick](const std::shared_ptr<Context> &, Value & args) -> Value {
    return pick(args, "max", true);
  }));
  globals.set("min", simple_function("min", { "value", "case_sensitive", "attribute" }, [pick](const std::shared_ptr<Context> &, Value & args) -> Value {
    return pick(args, "min", false);
  }));
  globals.set("sum", simple_function("sum", { "iterable", "attribute", "start" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    auto & items = args.at("iterable");
    if (!items.is_array()) throw std::runtime_error("sum: object is not a list");
    const Value attr = args.contains("attribute") ? args.at("attribute") : Value();
    Value total = args.contains("start") ? args.at("start") : Value(int64_t{0});
    for (size_t i = 0; i < items.size(); ++i) {
      Value x = items.at(i);
      const Value term = attr.is_null() ? x : x.get(attr);
      if (!term.is_number() || !total.is_number()) throw std::runtime_error("sum: items must be numbers, got " + term.dump());
      total = total + term;
    }
    return total;
  }));
  globals.set("round", simple_function("round", { "value", "precision", "method" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    auto & v = args.at("value");
    const int64_t precision = args.contains("precision") ? args.at("precision").get<int64_t>() : 0;
    const std::string method = args.contains("method") ? args.at("method").get<std::string>() : "common";
    if (precision < 0 || precision > 17) throw std::runtime_error("round: precision must be 0 to 17");
    if (method != "common" && method != "floor" && method != "ceil")
      throw std::runtime_error("round: method must be common, floor or ceil");
    if (v.is_number_integer() && method == "common") return v;  // Python's round(int, n) is the int
    const double d = v.get<double>();
    if (method == "common") {  // Python's round: the exact binary value, ties to even (printf's rounding)
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), d);
      return std::strtod(buf, nullptr);
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    return (method == "floor" ? std::floor(d * scale) : std::ceil(d * scale)) / scale;
  }));
  globals.set("reverse", simple_function("reverse", { "value" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    auto & v = args.at("value");
    if (v.is_string()) {
      const std::string str = v.get<std::string>();
      std::vector<std::string> cps;
      for (size_t i = 0, next; i < str.size(); i = next) {
        next = utf8_next(str, i);
        cps.push_back(str.substr(i, next - i));
      }
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return out;
    }
    if (!v.is_array()) throw std::runtime_error("reverse: object is not a list or string");
    auto result = Value::array();
    for (size_t i = v.size(); i-- > 0;) result.push_back(v.at(i));
    return result;
  }));
  globals.set("sort", simple_function("sort", { "value", "reverse", "case_sensitive", "attribute" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    auto & v = args.at("value");
    if (!v.is_array()) throw std::runtime_error("sort: object is not a list");
    const bool reverse = args.contains("reverse") && args.at("reverse").to_bool();
    const bool case_sensitive = args.contains("case_sensitive") && args.at("case_sensitive").to_bool();
    const Value attr = args.contains("attribute") ? args.at("attribute") : Value();
    std::vector<std::pair<Value, Value>> keyed;  // (key, item)
    for (size_t i = 0; i < v.size(); ++i) {
      Value x = v.at(i);
      Value k = attr.is_null() ? x : x.get(attr);
      if (k.is_string() && !case_sensitive) {
        std::string t = k.get<std::string>();
        std::transform(t.begin(), t.end(), t.begin(), ::tolower);
        k = t;
      }
      keyed.emplace_back(k, x);
    }
    // stable, as Python's sorted; reverse keeps equal items in order, as sorted(reverse=True)
    std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto & a, const auto & b) {
      return reverse ? b.first < a.first : a.first < b.first;
    });
    auto result = Value::array();
    for (auto & kv : keyed) result.push_back(kv.second);
    return result;
  }));
  globals.set("trim", simple_function("trim", { "text", "chars" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto & text = args.at("text");
    // megakernel: jinja2's trim(chars) (upstream took no chars)
    const std::string chars = args.contains("chars") && !args.at("chars").is_null() ? args.at("chars").get<std::string>() : "";
    return text.is_null() ? text : Value(strip(text.get<std::string>(), chars));
  }));
  // megakernel: by code point, beyond ASCII (utf8_upper / utf8_lower)
  auto case_function = [](const std::string & name, std::string (*fn)(const std::string &)) {
    return simple_function(name, { "text" }, [=](const std::shared_ptr<Context> &, Value & args) {
      auto text = args.at("text");
      if (text.is_null()) return text;
      return Value(fn(text.get<std::string>()));
    });
  };
  globals.set("lower", case_function("lower", utf8_lower));
  globals.set("upper", case_function("upper", utf8_upper));
  // megakernel: Jinja2's capitalize, title and replace filters, as the string methods of those names
  globals.set("capitalize", simple_function("capitalize", { "text" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto & text = args.at("text");
    return text.is_null() ? text : Value(capitalize(text.get<std::string>()));
  }));
  globals.set("title", simple_function("title", { "text" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto & text = args.at("text");
    return text.is_null() ? text : Value(title_case(text.get<std::string>(), /* jinja2_filter= */ true));
  }));
  globals.set("replace", simple_function("replace", { "text", "old", "new", "count" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto & text = args.at("text");
    if (text.is_null()) return text;
    int64_t count = args.contains("count") && !args.at("count").is_null() ? args.at("count").get<int64_t>() : -1;
    return Value(replace_count(text.get<std::string>(), args.at("old").get<std::string>(), args.at("new").get<std::string>(), count));
  }));
  globals.set("default", Value::callable([=](const std::shared_ptr<Context> &, ArgumentsValue & args) {
    args.expectArgs("default", {2, 3}, {0, 1});
    auto & value = args.args[0];
    auto & default_value = args.args[1];
    bool boolean = false;
    if (args.args.size() == 3) {
      boolean = args.args[2].get<bool>();
    } else {
      Value bv = args.get_named("boolean");
      if (!bv.is_null()) {
        boolean = bv.get<bool>();
      }
    }
    return boolean ? (value.to_bool() ? value : default_value) : value.is_null() ? default_value : value;
  }));
  auto escape = simple_function("escape", { "text" }, [](const std::shared_ptr<Context> &, Value & args) {
    return Value(html_escape(args.at("text").get<std::string>()));
  });
  globals.set("e", escape);
  globals.set("escape", escape);
  globals.set("joiner", simple_function("joiner", { "sep" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto sep = args.get<std::string>("sep", "");
    auto first = std::make_shared<bool>(true);
    return simple_function("", {}, [sep, first](const std::shared_ptr<Context> &, const Value &) -> Value {
      if (*first) {
        *first = false;
        return "";
      }
      return sep;
    });
    return Value(html_escape(args.at("text").get<std::string>()));
  }));
  globals.set("count", simple_function("count", { "items" }, [](const std::shared_ptr<Context> &, Value & args) {
    return Value((int64_t) args.at("items").size());
  }));
  globals.set("dictsort", simple_function("dictsort", { "value" }, [](const std::shared_ptr<Context> &, Value & args) {
    if (args.size() != 1) throw std::runtime_error("dictsort expects exactly 1 argument (TODO: fix implementation)");
    auto & value = args.at("value");
    auto keys = value.keys();
    std::sort(keys.begin(), keys.end());
    auto res = Value::array();
    for (auto & key : keys) {
      res.push_back(Value::array({key, value.at(key)}));
    }
    return res;
  }));
  globals.set("join", simple_function("join", { "items", "d" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto do_join = [](Value & items, const std::string & sep) {
      if (!items.is_array()) throw std::runtime_error("object is not iterable: " + items.dump());
      std::ostringstream oss;
      auto first = true;
      for (size_t i = 0, n = items.size(); i < n; ++i) {
        if (first) first = false;
        else oss << sep;
        oss << items.at(i).to_str();
      }
      return Value(oss.str());
    };
    auto sep = args.get<std::string>("d", "");
    if (args.contains("items")) {
        auto & items = args.at("items");
        return do_join(items, sep);
    } else {
      return simple_function("", {"items"}, [sep, do_join](const std::shared_ptr<Context> &, Value & args) {
        auto & items = args.at("items");
        if (!items.to_bool() || !items.is_array()) throw std::runtime_error("join expects an array for items, got: " + items.dump());
        return do_join(items, sep);
      });
    }
  }));
  globals.set("namespace", Value::callable([=](const std::shared_ptr<Context> &, ArgumentsValue & args) {
    auto ns = Value::object();
    args.expectArgs("namespace", {0, 0}, {0, (std::numeric_limits<size_t>::max)()});
    for (auto & [name, value] : args.kwargs) {
      ns.set(name, value);
    }
    return ns;
  }));
  auto equalto = simple_function("equalto", { "expected", "actual" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
      return args.at("actual") == args.at("expected");
  });
  globals.set("equalto", equalto);
  globals.set("==", equalto);
  // megakernel: jinja2's comparison tests by name, for select / selectattr ('eq', 'gt', ...)
  globals.set("eq", equalto);
  auto compare_test = [](const std::string & name, int kind) {
    return simple_function(name, { "value", "other" }, [kind](const std::shared_ptr<Context> &, Value & args) -> Value {
      auto & a = args.at("value");
      auto & b = args.at("other");
      switch (kind) {
        case 0: return a != b;
        case 1: return a < b;
        case 2: return a <= b;
        case 3: return a > b;
        default: return a >= b;
      }
    });
  };
  globals.set("ne", compare_test("ne", 0));
  globals.set("lt", compare_test("lt", 1));
  globals.set("le", compare_test("le", 2));
  globals.set("gt", compare_test("gt", 3));
  globals.set("ge", compare_test("ge", 4));
  globals.set("lessthan", compare_test("lessthan", 1));
  globals.set("greaterthan", compare_test("greaterthan", 3));
  globals.set("divisibleby", simple_function("divisibleby", { "value", "num" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
    auto & a = args.at("value");
    auto & n = args.at("num");
    if (n.get<double>() == 0) throw std::runtime_error("divisibleby 0");
    if (a.is_number_integer() && n.is_number_integer()) return n.get<int64_t>() == -1 || a.get<int64_t>() % n.get<int64_t>() == 0;
    return std::fmod(a.get<double>(), n.get<double>()) == 0;
  }));
  globals.set("length", simple_function("length", { "items" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
      auto & items = args.at("items");
      return (int64_t) items.size();
  }));
  globals.set("safe", simple_function("safe", { "value" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
      return args.at("value").to_str();
  }));
  globals.set("string", simple_function("string", { "value" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
      return args.at("value").to_str();
  }));
  globals.set("int", simple_function("int", { "value" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
      return args.at("value").to_int();
  }));
  globals.set("list", simple_function("list", { "items" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
      auto & items = args.at("items");
      if (items.is_array()) return items;
      // megakernel: a string's characters and a dict's keys, as Python's list()
      if (!items.is_string() && !items.is_object()) throw std::runtime_error("object is not iterable");
      auto result = Value::array();
      items.for_each([&](Value & item) { result.push_back(item); });
      return result;
  }));
  globals.set("in", simple_function("in", { "item", "items" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
      return in(args.at("item"), args.at("items"));
  }));
  globals.set("unique", simple_function("unique", { "items" }, [](const std::shared_ptr<Context> &, Value & args) -> Value {
      auto & items = args.at("items");
      if (!items.is_array()) throw std::runtime_error("object is not iterable");
      std::unordered_set<Value> seen;
      auto result = Value::array();
      for (size_t i = 0, n = items.size(); i < n; i++) {
        auto pair = seen.insert(items.at(i));
        if (pair.second) {
          result.push_back(items.at(i));
        }
      }
      return result;
  }));
  auto make_filter = [](const Value & filter, Value & extra_args) -> Value {
    return simple_function("", { "value" }, [=](const std::shared_ptr<Context> & context, Value & args) {
      auto & value = args.at("value");
      ArgumentsValue actual_args;
      actual_args.args.emplace_back(value);
      for (size_t i = 0, n = extra_args.size(); i < n; i++) {
        actual_args.args.emplace_back(extra_args.at(i));
      }
      return filter.call(context, actual_args);
    });
  };
  auto select_or_reject = [make_filter](bool is_select) {
    return Value::callable([=](const std::shared_ptr<Context> & context, ArgumentsValue & args) {
      args.expectArgs(is_select ? "select" : "reject", {1, (std::numeric_limits<size_t>::max)()}, {0, 0});
      auto & items = args.args[0];
      if (items.is_null()) {
        return Value::array();
      }
      if (!items.is_array()) {
        throw std::runtime_error("object is not iterable: " + items.dump());
      }
      if (args.args.size() == 1) {  // megakernel: without a test, each item's truth, as jinja2
        auto res = Value::array();
        for (size_t i = 0, n = items.size(); i < n; i++)
          if (items.at(i).to_bool() == is_select) res.push_back(items.at(i));
        return res;
      }

      const std::string test = args.args[1].is_string() ? args.args[1].get<std::string>() : "";
      if (args.args.size() == 2 && (test == "odd" || test == "even" || BinaryOpExpr::named_test(test, Value()).has_value())) {
        // megakernel: a jinja2 test by name (select('string'), reject('none')); jinja2's select takes
        // tests, so 'string' is the test even though a filter has that name
        auto res = Value::array();
        for (size_t i = 0, n = items.size(); i < n; i++)
          if (*BinaryOpExpr::named_test(test, items.at(i)) == is_select) res.push_back(items.at(i));
        return res;
      }
      auto filter_fn = context->get(args.args[1]);
      if (filter_fn.is_null()) {
        throw std::runtime_error("Undefined filter: " + args.args[1].dump());
      }

      auto filter_args = Value::array();
      for (size_t i = 2, n = args.args.size(); i < n; i++) {
        filter_args.push_back(args.args[i]);
      }
      auto filter = make_filter(filter_fn, filter_args);

      auto res = Value::array();
      for (size_t i = 0, n = items.size(); i < n; i++) {
        auto & item = items.at(i);
        ArgumentsValue filter_args;
        filter_args.args.emplace_back(item);
        auto pred_res = filter.call(context, filter_args);
        if (pred_res.to_bool() == (is_select ? true : false)) {
          res.push_back(item);
        }
      }
      return res;
    });
  };
  globals.set("select", select_or_reject(/* is_select= */ true));
  globals.set("reject", select_or_reject(/* is_select= */ false));
  globals.set("map", Value::callable([=](const std::shared_ptr<Context> & context, ArgumentsValue & args) {
    auto res = Value::array();
    if (args.args.size() == 1 &&
      ((args.has_named("attribute") && args.kwargs.size() == 1) || (args.has_named("default") && args.kwargs.size() == 2))) {
      auto & items = args.args[0];
      auto attr_name = args.get_named("attribute");
      auto default_value = args.get_named("default");
      for (size_t i = 0, n = items.size(); i < n; i++) {
        auto & item = items.at(i);
        auto attr = item.get(attr_name);
        res.push_back(attr.is_null() ? default_value : attr);
      }
    } else if (args.kwargs.empty() && args.args.size() >= 2) {
      auto fn = context->get(args.args[1]);
      if (fn.is_null()) throw std::runtime_error("Undefined filter: " + args.args[1].dump());
      ArgumentsValue filter_args { {Value()}, {} };
      for (size_t i = 2, n = args.args.size(); i < n; i++) {
        filter_args.args.emplace_back(args.args[i]);
      }
      for (size_t i = 0, n = args.args[0].size(); i < n; i++) {
        auto & item = args.args[0].at(i);
        filter_args.args[0] = item;
        res.push_back(fn.call(context, filter_args));
      }
    } else {
      throw std::runtime_error("Invalid or unsupported arguments for map");
    }
    return res;
  }));
  globals.set("indent", simple_function("indent", { "text", "indent", "first" }, [](const std::shared_ptr<Context> &, Value & args) {
    auto text = args.at("text").get<std::string>();
    auto first = args.get<bool>("first", false);
    std::string out;
    const auto width = args.get<int64_t>("indent", 0);  // megakernel: bounded
    if (width < 0 || static_cast<uint64_t>(width) > limits::kMaxStringLength) throw LimitError("template limit: indent() width " + std::to_string(width));
    std::string indent(static_cast<size_t>(width), ' ');
    std::istringstream iss(text);
    std::string line;
    auto is_first = true;
    while (std::getline(iss, line, '\n')) {
      auto needs_indent = !is_first || first;
      if (is_first) is_first = false;
      else out += "\n";
      if (needs_indent) out += indent;
      out += line;
    }
    if (!text.empty() && text.back() == '\n') out += "\n";
    return out;
  }));
  auto select_or_reject_attr = [](bool is_select) {
    return Value::callable([=](const std::shared_ptr<Context> & context, ArgumentsValue & args) {
      args.expectArgs(is_select ? "selectattr" : "rejectattr", {2, (std::numeric_limits<size_t>::max)()}, {0, 0});
      auto & items = args.args[0];
      if (items.is_null())
        return Value::array();
      if (!items.is_array()) throw std::runtime_error("object is not iterable: " + items.dump());
      auto attr_name = args.args[1].get<std::string>();

      bool has_test = false;
      Value test_fn;
      ArgumentsValue test_args {{Value()}, {}};
      // megakernel: a jinja2 test by name ('defined', 'string', 'none', 'odd' ...), as `is` has them
      const std::string test = args.args.size() == 3 && args.args[2].is_string() ? args.args[2].get<std::string>() : "";
      const bool named = !test.empty() && (test == "odd" || test == "even" || BinaryOpExpr::named_test(test, Value()).has_value());
      if (args.args.size() >= 3 && !named) {
        has_test = true;
        test_fn = context->get(args.args[2]);
        if (test_fn.is_null()) throw std::runtime_error("Undefined test: " + args.args[2].dump());
        for (size_t i = 3, n = args.args.size(); i < n; i++) {
          test_args.args.emplace_back(args.args[i]);
        }
        test_args.kwargs = args.kwargs;
      }

      auto res = Value::array();
      for (size_t i = 0, n = items.size(); i < n; i++) {
        auto & item = items.at(i);
        auto attr = item.get(attr_name);
        if (named) {
          if (*BinaryOpExpr::named_test(test, attr) == is_select) res.push_back(item);
        } else if (has_test) {
          test_args.args[0] = attr;
          if (test_fn.call(context, test_args).to_bool() == (is_select ? true : false)) {
            res.push_back(item);
          }
        } else if (attr.to_bool() == is_select) {
          // megakernel: without a test, the items whose attribute is true (upstream listed the
          // attributes themselves)
          res.push_back(item);
        }
      }
      return res;
    });
  };
  globals.set("selectattr", select_or_reject_attr(/* is_select= */ true));
  globals.set("rejectattr", select_or_reject_attr(/* is_select= */ false));
  globals.set("range", Value::callable([=](const std::shared_ptr<Context> &, ArgumentsValue & args) {
    std::vector<int64_t> startEndStep(3);
    std::vector<bool> param_set(3);
    if (args.args.size() == 1) {
      startEndStep[1] = args.args[0].get<int64_t>();
      param_set[1] = true;
    } else {
      for (size_t i = 0; i < args.args.size(); i++) {
        auto & arg = args.args[i];
        auto v = arg.get<int64_t>();
        startEndStep[i] = v;
        param_set[i] = true;
      }
    }
    for (auto & [name, value] : args.kwargs) {
      size_t i;
      if (name == "start") {
        i = 0;
      } else if (name == "end") {
        i = 1;
      } else if (name == "step") {
        i = 2;
      } else {
        throw std::runtime_error("Unknown argument " + name + " for function range");
      }

      if (param_set[i]) {
        throw std::runtime_error("Duplicate argument " + name + " for function range");
      }
      startEndStep[i] = value.get<int64_t>();
      param_set[i] = true;
    }
    if (!param_set[1]) {
      throw std::runtime_error("Missing required argument 'end' for function range");
    }
    int64_t start = param_set[0] ? startEndStep[0] : 0;
    int64_t end = startEndStep[1];
    int64_t step = param_set[2] ? startEndStep[2] : 1;
    // megakernel: step 0 looped for ever; the length is bounded (computed without overflow)
    if (step == 0) throw std::runtime_error("range() step must not be zero");
    const __int128 span = step > 0 ? static_cast<__int128>(end) - start : static_cast<__int128>(start) - end;
    const __int128 length = span <= 0 ? 0 : (span + (step > 0 ? step : -static_cast<__int128>(step)) - 1) / (step > 0 ? step : -static_cast<__int128>(step));
    if (length > limits::kMaxRangeLength)
      throw LimitError("template limit: range() of more than " + std::to_string(limits::kMaxRangeLength) + " items");
    auto res = Value::array();
    for (int64_t k = 0; k < static_cast<int64_t>(length); ++k) res.push_back(Value(start + k * step));
    return res;
  }));

  return std::make_shared<Context>(std::move(globals));
}

inline std::shared_ptr<Context> Context::make(Value && values, const std::shared_ptr<Context> & parent) {
  return std::make_shared<Context>(values.is_null() ? Value::object() : std::move(values), parent);
}

}  // namespace minja
