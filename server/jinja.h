// A Jinja interpreter for chat templates: the subset that models' templates use, rendered the way
// Hugging Face transformers renders them with Python's jinja2 (trim_blocks, lstrip_blocks, loop
// controls, `raise_exception`, `strftime_now`, a `tojson` that does not escape HTML, and the
// immutable sandbox: no mutation of lists or dicts). Golden renders made by jinja2 pin the
// behaviour (tests/testdata/chat_templates). No template inheritance, includes or imports.
//
// Supported: {{ }}, {% %}, {# #} with - and + whitespace control, raw; if/elif/else, for (with
// tuple targets, an `if` filter, else, loop.index/index0/revindex/revindex0/first/last/length/
// previtem/nextitem/cycle, break, continue), set (names, tuples, namespace attributes, blocks),
// macro (positional and keyword arguments, defaults), generation (a no-op block, as
// transformers' extension); Python semantics for literals, arithmetic, comparison, `in`,
// slicing, str()/repr() and truthiness; the string, dict and filter/test names listed in
// jinja.cc. Anything else is an error naming the line, never a silent difference.
#ifndef MODSERVE_SERVER_JINJA_H_
#define MODSERVE_SERVER_JINJA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace modserve::server::jinja {

class Value;
class Renderer;

// Positional and keyword arguments of a call, filter or test.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<absl::StatusOr<Value>(Renderer &, CallArgs &)>;

// An ordered string-keyed map (Python dicts keep insertion order; JSON objects map to it).
class Dict {
 public:
  // Inserts or replaces.
  void Set(std::string key, Value value);
  const Value *Find(std::string_view key) const;
  const std::vector<std::pair<std::string, Value>> &items() const { return items_; }
  size_t size() const;  // defined below, where Value is complete

 private:
  std::vector<std::pair<std::string, Value>> items_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// A template value: Python's None, bool, int (64-bit), float, str (UTF-8), list, tuple, dict,
// jinja2's Undefined, a namespace() object or a callable. Copies are cheap (shared, immutable
// payloads; a namespace is the one mutable object, shared by reference as in Python).
class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kNamespace,
    kFunction,
    kLoop,  // the `loop` variable of a for loop (its attributes are computed on access)
  };

  Value() = default;  // Undefined
  static Value Undefined(std::string name = "");
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  static Value FromDict(Dict dict);
  static Value Namespace(Dict initial);
  static Value Callable(std::string name, Function fn);
  // For the renderer: `state` is its loop bookkeeping, opaque here.
  static Value Loop(std::shared_ptr<const void> state);
  // JSON -> Value: objects keep their key order (ordered_json); integers that do not fit int64
  // become floats.
  static Value FromJson(const nlohmann::ordered_json &json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const {  // int, float and bool (Python's bool is an int)
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (bool_ ? 1 : 0) : int_; }
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(as_int()); }
  const std::string &as_string() const;       // kString
  const std::vector<Value> &as_list() const;  // kList, kTuple
  const Dict &as_dict() const;                // kDict, kNamespace
  Dict &mutable_namespace() const;            // kNamespace
  const Function &as_function() const;        // kFunction
  const std::string &undefined_name() const;  // kUndefined ("" when anonymous)
  const std::string &function_name() const;

  // The shared payload (Python's `is` for namespaces and functions).
  const void *identity() const { return ptr_.get(); }

  // Python's bool(value); Undefined is false.
  bool Truthy() const;

 private:
  Kind kind_ = Kind::kUndefined;
  union {
    bool bool_;
    int64_t int_ = 0;
    double float_;
  };
  // String, list, dict or function payload by kind; the undefined name; the function name.
  std::shared_ptr<const void> ptr_;
  std::shared_ptr<const std::string> name_;
};

// Python's str(value) (jinja2 prints with it; Undefined prints as "").
std::string Str(const Value &value);
// Python's repr(value).
std::string Repr(const Value &value);
// json.dumps(value, ensure_ascii=False, indent, separators, sort_keys) as Python writes it.
// InvalidArgument for a value JSON cannot hold (Undefined, a function, a namespace).
absl::StatusOr<std::string> ToJson(const Value &value, int indent, bool sort_keys,
                                   std::string_view item_separator, std::string_view key_separator);

// Resource bounds of one render, so a hostile template (or one looping over a huge range) ends with
// ResourceExhausted instead of exhausting the server.
struct RenderLimits {
  int64_t max_output_bytes = int64_t{16} << 20;
  int64_t max_steps = 5'000'000;  // expression evaluations and statements (about 1 s)
  int32_t max_call_depth = 64;    // nested macro calls
};

struct Node;

// Parsed once, rendered many times from any number of threads (Render is const and keeps its state
// on the stack).
class Template {
 public:
  // InvalidArgument "line N: ..." for a syntax error, an unknown tag, or source that is not UTF-8.
  // Nesting deeper than 200 levels is refused (the parser recurses).
  static absl::StatusOr<Template> Parse(std::string_view source);

  // `context` is a dict of top-level variables. InvalidArgument "line N: ..." for a runtime error
  // (an undefined value used, a type error, an unknown filter); the template's own message for
  // raise_exception (IsRaisedByTemplate is then true); ResourceExhausted past `limits`.
  absl::StatusOr<std::string> Render(const Value &context, const RenderLimits &limits = {}) const;

 private:
  std::shared_ptr<const Node> root_;
};

// True when `status` came from the template's raise_exception() (its message is the template's).
bool IsRaisedByTemplate(const absl::Status &status);

inline size_t Dict::size() const { return items_.size(); }

}  // namespace modserve::server::jinja

#endif  // MODSERVE_SERVER_JINJA_H_
