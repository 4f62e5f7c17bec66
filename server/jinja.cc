// The interpreter: a lexer that reproduces jinja2's whitespace rules, a recursive-descent parser
// with jinja2's operator precedence, and a tree-walking renderer with Python value semantics.
// Semantics were checked case by case against jinja2 3.1 (goldens.json); where Python has
// arbitrary-precision ints we refuse an overflow instead.
#include "server/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/utf8.h"
#include "server/jinja_text.h"

namespace modserve::server::jinja {

namespace {

// absl::StrCat for std::string_view arguments too (Debian's Abseil has its own string_view).
template <typename T>
const T &CatArg(const T &v) {
  return v;
}
inline absl::string_view CatArg(std::string_view v) {
  return absl::string_view(v.data(), v.size());
}
template <typename... Args>
std::string Cat(const Args &...args) {
  return absl::StrCat(CatArg(args)...);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Values

void Dict::Set(std::string key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(std::move(key), std::move(value));
}

const Value *Dict::Find(std::string_view key) const {
  auto it = index_.find(absl::string_view(key.data(), key.size()));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

Value Value::Undefined(std::string name) {
  Value v;
  if (!name.empty()) v.name_ = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.ptr_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::List(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.ptr_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}
Value Value::Tuple(std::vector<Value> items) {
  Value v = List(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}
Value Value::FromDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.ptr_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}
Value Value::Namespace(Dict initial) {
  Value v;
  v.kind_ = Kind::kNamespace;
  // Mutable through mutable_namespace(): `{% set ns.x = ... %}` changes it for every holder.
  v.ptr_ = std::make_shared<Dict>(std::move(initial));
  return v;
}
Value Value::Loop(std::shared_ptr<const void> state) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.ptr_ = std::move(state);
  return v;
}

Value Value::Callable(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.ptr_ = std::make_shared<const Function>(std::move(fn));
  v.name_ = std::make_shared<const std::string>(std::move(name));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json &json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Int(static_cast<int64_t>(u));
      return Float(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto &item : json) items.push_back(FromJson(item));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto &[key, item] : json.items()) d.Set(key, FromJson(item));
      return FromDict(std::move(d));
    }
    case nlohmann::ordered_json::value_t::binary:
    case nlohmann::ordered_json::value_t::discarded:
      return None();
  }
  return None();
}

const std::string &Value::as_string() const {
  return *static_cast<const std::string *>(ptr_.get());
}
const std::vector<Value> &Value::as_list() const {
  return *static_cast<const std::vector<Value> *>(ptr_.get());
}
const Dict &Value::as_dict() const { return *static_cast<const Dict *>(ptr_.get()); }
Dict &Value::mutable_namespace() const {
  // Created non-const in Namespace(); only namespaces are ever written through this.
  return *static_cast<Dict *>(const_cast<void *>(ptr_.get()));
}
const Function &Value::as_function() const { return *static_cast<const Function *>(ptr_.get()); }
const std::string &Value::undefined_name() const {
  static const std::string *empty = new std::string();
  return name_ ? *name_ : *empty;
}
const std::string &Value::function_name() const { return undefined_name(); }

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !as_list().empty();
    case Kind::kDict:
      return as_dict().size() > 0;
    case Kind::kNamespace:
    case Kind::kFunction:
    case Kind::kLoop:
      return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// str(), repr() and json.dumps()

std::string Str(const Value &v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kNamespace:
      return "<Namespace " + Repr(Value::FromDict(v.as_dict())) + ">";
    default:
      return Repr(v);
  }
}

std::string Repr(const Value &v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return Cat(v.as_int());
    case Value::Kind::kFloat:
      return PythonFloatRepr(v.as_float());
    case Value::Kind::kString:
      return PythonStringRepr(v.as_string());
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const bool tuple = v.kind() == Value::Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      const auto &items = v.as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr(items[i]);
      }
      if (tuple && items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return out;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      std::string out = "{";
      bool first = true;
      for (const auto &[key, item] : v.as_dict().items()) {
        if (!first) out += ", ";
        first = false;
        absl::StrAppend(&out, PythonStringRepr(key), ": ", Repr(item));
      }
      return out + "}";
    }
    case Value::Kind::kFunction:
      return "<function " + v.function_name() + ">";
    case Value::Kind::kLoop:
      return "<LoopContext>";
  }
  return "";
}

namespace {

absl::Status JsonInto(const Value &v, int indent, int depth, bool sort_keys,
                      std::string_view item_sep, std::string_view key_sep, std::string *out) {
  if (depth > 200) return absl::InvalidArgumentError("tojson: nesting too deep");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * d, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double f = v.as_float();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += PythonFloatRepr(f);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.as_string(), out);
      return absl::OkStatus();
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto &items = v.as_list();
      if (items.empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(item_sep);
        newline(depth + 1);
        MODSERVE_RETURN_IF_ERROR(
            JsonInto(items[i], indent, depth + 1, sort_keys, item_sep, key_sep, out));
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value> *> items;
      for (const auto &item : v.as_dict().items()) items.push_back(&item);
      if (items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto *a, const auto *b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(item_sep);
        newline(depth + 1);
        AppendJsonString(items[i]->first, out);
        out->append(key_sep);
        MODSERVE_RETURN_IF_ERROR(
            JsonInto(items[i]->second, indent, depth + 1, sort_keys, item_sep, key_sep, out));
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kNamespace:
    case Value::Kind::kFunction:
    case Value::Kind::kLoop:
      break;
  }
  return absl::InvalidArgumentError(Cat("tojson: ", Repr(v), " is not JSON serializable"));
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value &value, int indent, bool sort_keys,
                                   std::string_view item_separator,
                                   std::string_view key_separator) {
  std::string out;
  MODSERVE_RETURN_IF_ERROR(
      JsonInto(value, indent, 0, sort_keys, item_separator, key_separator, &out));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Lexer: jinja2's token stream, with its whitespace rules (trim_blocks and lstrip_blocks on, as
// transformers configures them; '-' strips, '+' keeps).

namespace {

enum class Tok {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // data, name, operator, or the decoded string literal
  Value number;      // kInt / kFloat
  int line;
};

absl::Status SyntaxError(int line, std::string_view what) {
  return absl::InvalidArgumentError(Cat("template line ", line, ": ", what));
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Python's str.rstrip() of template data (ASCII whitespace plus the Unicode spaces).
std::string RStripData(std::string_view text) {
  return PythonStrip(text, std::nullopt, /*left=*/false, /*right=*/true);
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      const size_t start = FindTagStart(pos_);
      if (start == std::string::npos) {
        Emit(Tok::kData, src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const char kind = src_[start + 1];  // '{', '%' or '#'
      size_t p = start + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      if (sign == '-') {
        text = RStripData(text);
      } else if (sign != '+' && kind != '{') {
        LStripBlock(&text);
      }
      line_ += CountLines(src_.substr(pos_, start - pos_));
      Emit(Tok::kData, std::move(text));
      pos_ = p;
      if (kind == '#') {
        MODSERVE_RETURN_IF_ERROR(Comment());
      } else if (kind == '%' && IsRawBegin()) {
        MODSERVE_RETURN_IF_ERROR(Raw());
      } else {
        MODSERVE_RETURN_IF_ERROR(Tag(kind == '{'));
      }
    }
    tokens_.push_back({Tok::kEof, "", Value(), line_});
    return std::move(tokens_);
  }

 private:
  static int CountLines(std::string_view s) {
    return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block or comment tag go.
  void LStripBlock(std::string *text) const {
    const size_t nl = text->rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting_) return;
    std::string_view tail = std::string_view(*text).substr(l_pos);
    if (tail.empty()) return;
    const std::vector<char32_t> cps = DecodeUtf8(tail);
    if (std::all_of(cps.begin(), cps.end(), IsPythonSpace)) text->resize(l_pos);
  }

  void Emit(Tok type, std::string text) {
    if (type == Tok::kData && text.empty()) return;
    tokens_.push_back({type, std::move(text), Value(), line_});
  }

  // After a tag end at pos_: '-' strips following whitespace; a block or comment end (no '+') eats
  // one newline (trim_blocks).
  void AfterEnd(char sign, bool block) {
    const size_t before = pos_;
    if (sign == '-') {
      while (pos_ < src_.size() && IsAsciiSpace(src_[pos_])) ++pos_;
    } else if (block && sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += CountLines(std::string_view(src_).substr(before, pos_ - before));
    const char last = pos_ > 0 ? src_[pos_ - 1] : 0;
    line_starting_ = last == '\n';
  }

  absl::Status Comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return SyntaxError(line_, "missing end of comment tag");
    const char sign = end > pos_ && src_[end - 1] == '-' ? '-' : 0;
    line_ += CountLines(std::string_view(src_).substr(pos_, end - pos_));
    pos_ = end + 2;
    AfterEnd(sign, /*block=*/true);
    return absl::OkStatus();
  }

  bool IsRawBegin() const {
    size_t p = pos_;
    while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  // {% raw %}...{% endraw %}: the text between is data, untouched.
  absl::Status Raw() {
    size_t p = src_.find("raw", pos_) + 3;
    while (IsAsciiSpace(src_[p])) ++p;
    if (src_[p] == '-') {
      p += 3;
      while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    } else {
      p += 2;
    }
    for (size_t at = src_.find("{%", p); at != std::string::npos; at = src_.find("{%", at + 2)) {
      size_t q = at + 2;
      char begin_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) begin_sign = src_[q++];
      while (q < src_.size() && IsAsciiSpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && IsAsciiSpace(src_[q])) ++q;
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(p, at - p);
      line_ += CountLines(std::string_view(src_).substr(pos_, at - pos_));
      if (begin_sign == '-') {
        text = RStripData(text);
      } else if (begin_sign != '+') {
        LStripBlock(&text);
      }
      Emit(Tok::kData, std::move(text));
      pos_ = q + 2;
      AfterEnd(end_sign, /*block=*/true);
      return absl::OkStatus();
    }
    return SyntaxError(line_, "missing {% endraw %}");
  }

  // The expression tokens of one {{ }} or {% %} tag, and its end.
  absl::Status Tag(bool variable) {
    tokens_.push_back({variable ? Tok::kVarBegin : Tok::kBlockBegin, "", Value(), line_});
    std::vector<char> balance;
    for (;;) {
      while (pos_ < src_.size() && IsAsciiSpace(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        return SyntaxError(line_, variable ? "unexpected end of template, expected '}}'"
                                           : "unexpected end of template, expected '%}'");
      }
      if (balance.empty() && TryEnd(variable)) return absl::OkStatus();
      MODSERVE_RETURN_IF_ERROR(ExpressionToken(&balance));
    }
  }

  bool TryEnd(bool variable) {
    const std::string_view rest = std::string_view(src_).substr(pos_);
    const std::string_view close = variable ? "}}" : "%}";
    char sign = 0;
    size_t n = 0;
    if (rest.substr(0, 2) == close) {
      n = 2;
    } else if (rest.size() >= 3 && (rest[0] == '-' || (!variable && rest[0] == '+')) &&
               rest.substr(1, 2) == close) {
      sign = rest[0];
      n = 3;
    } else {
      return false;
    }
    tokens_.push_back({variable ? Tok::kVarEnd : Tok::kBlockEnd, "", Value(), line_});
    pos_ += n;
    AfterEnd(sign, /*block=*/!variable);
    return true;
  }

  absl::Status ExpressionToken(std::vector<char> *balance) {
    const char c = src_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) return Number();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos_;
      while (end < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
        ++end;
      }
      tokens_.push_back({Tok::kName, src_.substr(pos_, end - pos_), Value(), line_});
      pos_ = end;
      return absl::OkStatus();
    }
    if (c == '\'' || c == '"') return StringLiteral();
    static constexpr std::string_view kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                                "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                                ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
    for (std::string_view op : kOps) {
      if (src_.compare(pos_, op.size(), op) != 0) continue;
      if (op == "(" || op == "[" || op == "{") {
        balance->push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance->empty() || balance->back() != op[0]) {
          return SyntaxError(line_, Cat("unexpected '", op, "'"));
        }
        balance->pop_back();
      }
      tokens_.push_back({Tok::kOp, std::string(op), Value(), line_});
      pos_ += op.size();
      return absl::OkStatus();
    }
    return SyntaxError(line_, Cat("unexpected character '", std::string(1, c), "'"));
  }

  // Digits with single underscores between them, from pos; returns the end (pos when none).
  size_t Digits(size_t p, bool (*is_digit)(char)) const {
    const size_t start = p;
    while (p < src_.size()) {
      if (is_digit(src_[p])) {
        ++p;
      } else if (src_[p] == '_' && p > start && p + 1 < src_.size() && is_digit(src_[p + 1])) {
        ++p;
      } else {
        break;
      }
    }
    return p;
  }

  absl::Status Number() {
    auto dec = [](char ch) { return ch >= '0' && ch <= '9'; };
    auto strip = [](std::string_view s) {
      std::string out;
      for (char ch : s) {
        if (ch != '_') out.push_back(ch);
      }
      return out;
    };
    // A float: digits, then a fraction and/or an exponent (not after a '.', as in `l.0`).
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    size_t p = Digits(pos_, +dec);
    if (!after_dot) {
      size_t q = p;
      bool is_float = false;
      if (q < src_.size() && src_[q] == '.' && q + 1 < src_.size() && dec(src_[q + 1])) {
        q = Digits(q + 1, +dec);
        is_float = true;
      }
      if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
        size_t r = q + 1;
        if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
        const size_t e_end = Digits(r, +dec);
        if (e_end > r) {
          q = e_end;
          is_float = true;
        }
      }
      if (is_float) {
        const std::string text = strip(std::string_view(src_).substr(pos_, q - pos_));
        tokens_.push_back(
            {Tok::kFloat, text, Value::Float(std::strtod(text.c_str(), nullptr)), line_});
        pos_ = q;
        return absl::OkStatus();
      }
    }
    // An integer: 0b / 0o / 0x prefixes, or decimal without a leading zero.
    int base = 10;
    size_t digits_begin = pos_;
    if (src_[pos_] == '0' && pos_ + 1 < src_.size()) {
      const char x = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[pos_ + 1])));
      if (x == 'b' || x == 'o' || x == 'x') base = x == 'b' ? 2 : x == 'o' ? 8 : 16;
    }
    if (base != 10) {
      auto digit_of_base =
          base == 2   ? +[](char ch) { return ch == '0' || ch == '1'; }
          : base == 8 ? +[](char ch) { return ch >= '0' && ch <= '7'; }
                      : +[](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; };
      digits_begin = pos_ + 2;
      // jinja2 allows an underscore right after the prefix.
      size_t d = digits_begin;
      if (d < src_.size() && src_[d] == '_') ++d;
      p = Digits(d, digit_of_base);
      if (p == d) return SyntaxError(line_, "invalid integer literal");
    } else if (src_[pos_] == '0') {
      p = pos_ + 1;
      while (p < src_.size() && (src_[p] == '0' || src_[p] == '_')) ++p;
    }
    const std::string digits = strip(std::string_view(src_).substr(digits_begin, p - digits_begin));
    int64_t value = 0;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
    if (ec != std::errc() || ptr != digits.data() + digits.size()) {
      return SyntaxError(line_, "integer literal out of range");
    }
    tokens_.push_back({Tok::kInt, src_.substr(pos_, p - pos_), Value::Int(value), line_});
    pos_ = p;
    return absl::OkStatus();
  }

  // A quoted literal with Python's unicode-escape decoding (unknown escapes stay as written).
  absl::Status StringLiteral() {
    const char quote = src_[pos_];
    const int start_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    for (;;) {
      if (p >= src_.size()) return SyntaxError(start_line, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return SyntaxError(start_line, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      auto hex = [&](int n) -> std::optional<char32_t> {
        if (p + n > src_.size()) return std::nullopt;
        char32_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = src_[p + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return std::nullopt;
          v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                 ? h - '0'
                                                 : std::tolower(h) - 'a' + 10);
        }
        p += n;
        return v;
      };
      switch (e) {
        case '\n':
          ++line_;
          break;  // a line continuation
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const std::optional<char32_t> v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (!v || *v > 0x10ffff || (*v >= 0xd800 && *v <= 0xdfff)) {
            return SyntaxError(start_line, "invalid escape in string literal");
          }
          AppendCodePoint(*v, &out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
              v = v * 8 + static_cast<char32_t>(src_[p++] - '0');
            }
            AppendCodePoint(v, &out);
          } else if (e == 'N') {
            return SyntaxError(start_line, "\\N{...} escapes are not supported");
          } else {
            out.push_back('\\');
            p -= 1;  // the character after the backslash is read again as itself
          }
      }
    }
    tokens_.push_back({Tok::kString, std::move(out), Value(), start_line});
    pos_ = p + 1;
    return absl::OkStatus();
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Syntax tree and parser (jinja2's grammar and operator precedence, lowest first: conditional
// expression, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary - +, then postfix .
// [] () and the | filter / `is` test chains).

enum class NodeKind {
  // Expressions.
  kConst,
  kName,
  kList,
  kTuple,
  kDict,
  kGetattr,
  kGetitem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNeg,
  kPos,
  kNot,
  kBinary,
  kAnd,
  kOr,
  kCompare,
  kCondExpr,
  kConcat,
  // Statements.
  kBody,
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kBreak,
  kContinue
};

// One node. Child layouts by kind:
//   kList, kTuple, kConcat, kBody: children = items
//   kDict: children = k0, v0, k1, v1, ...
//   kGetattr: children[0] object, name = attribute; kGetitem: children[0] object, [1] key
//   kSlice: children[0] object, [1..3] start, stop, step (null when absent)
//   kCall: children[0] callee, then the arguments; kFilter, kTest: children[0] operand, then
//     the arguments; `names` are the keyword names of the last names.size() arguments
//   kNeg, kPos, kNot: children[0]; kBinary: name = operator, children[0..1]; kAnd, kOr: [0..1]
//   kCompare: children[0], then one operand per operator in `names`
//   kCondExpr: children[0] test, [1] then, [2] else (null: undefined)
//   kOutput: children[0]; kText: name = the text
//   kIf: children = test, body, test, body, ... then the else body when has_else
//   kFor: children[0] target (kName or kTuple of kName), [1] iterable, [2] filter (or null),
//     [3] body, [4] else body (or null)
//   kSet: children[0] target (kName, kTuple of kName, or kGetattr of a kName), [1] value
//   kSetBlock: name = variable, children[0] body
//   kMacro: name, names = parameters, children[0] body, then one default per trailing parameter
struct Node {
  NodeKind kind;
  int line = 0;
  std::string name;
  std::vector<std::string> names;
  std::vector<std::shared_ptr<const Node>> children;
  Value value;            // kConst
  bool negated = false;   // kTest: `is not`
  bool has_else = false;  // kIf
};

namespace {

using NodePtr = std::shared_ptr<const Node>;
using MutableNode = std::shared_ptr<Node>;

MutableNode NewNode(NodeKind kind, int line) {
  auto n = std::make_shared<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<NodePtr> ParseTemplate() {
    std::string end_tag;
    MODSERVE_ASSIGN_OR_RETURN(NodePtr body, Subparse({}, &end_tag));
    return body;
  }

 private:
  const Token &Cur() const { return tokens_[pos_]; }
  const Token &Peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const { return Cur().type == Tok::kOp && Cur().text == op; }
  bool IsName(std::string_view name) const {
    return Cur().type == Tok::kName && Cur().text == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  absl::Status Unexpected(std::string_view wanted) const {
    std::string got;
    switch (Cur().type) {
      case Tok::kEof:
        got = "end of template";
        break;
      case Tok::kVarEnd:
        got = "'}}'";
        break;
      case Tok::kBlockEnd:
        got = "'%}'";
        break;
      case Tok::kData:
        got = "text";
        break;
      case Tok::kString:
        got = "a string";
        break;
      default:
        got = Cat("'", Cur().text, "'");
    }
    return SyntaxError(Cur().line, Cat("expected ", wanted, ", got ", got));
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!SkipOp(op)) return Unexpected(Cat("'", op, "'"));
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != Tok::kBlockEnd) return Unexpected("'%}'");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != Tok::kName) return Unexpected("a name");
    std::string name = Cur().text;
    Next();
    return name;
  }

  // Nesting guard: the parser recurses per level of nesting.
  class Depth {
   public:
    explicit Depth(Parser *p) : p_(p) { ++p_->depth_; }
    ~Depth() { --p_->depth_; }
    bool too_deep() const { return p_->depth_ > kMaxNesting; }

   private:
    Parser *p_;
  };

  // Statements until a {% tag %} named in `end_tags` (left unconsumed: Cur() is its name), or the
  // end of the template when `end_tags` is empty.
  absl::StatusOr<NodePtr> Subparse(const std::vector<std::string_view> &end_tags,
                                   std::string *end_tag) {
    Depth depth(this);
    if (depth.too_deep()) return SyntaxError(Cur().line, "blocks nested too deeply");
    MutableNode body = NewNode(NodeKind::kBody, Cur().line);
    for (;;) {
      const Token &t = Cur();
      switch (t.type) {
        case Tok::kData: {
          MutableNode text = NewNode(NodeKind::kText, t.line);
          text->name = t.text;
          body->children.push_back(text);
          Next();
          break;
        }
        case Tok::kVarBegin: {
          Next();
          MutableNode out = NewNode(NodeKind::kOutput, t.line);
          MODSERVE_ASSIGN_OR_RETURN(NodePtr e, Expression());
          out->children.push_back(e);
          if (Cur().type != Tok::kVarEnd) return Unexpected("'}}'");
          Next();
          body->children.push_back(out);
          break;
        }
        case Tok::kBlockBegin: {
          Next();
          if (Cur().type != Tok::kName) return Unexpected("a tag name");
          const std::string &tag = Cur().text;
          if (std::find(end_tags.begin(), end_tags.end(), tag) != end_tags.end()) {
            *end_tag = tag;
            return NodePtr(body);
          }
          MODSERVE_ASSIGN_OR_RETURN(NodePtr stmt, Statement());
          if (stmt != nullptr) body->children.push_back(stmt);
          break;
        }
        case Tok::kEof:
          if (!end_tags.empty()) {
            return SyntaxError(t.line, Cat("unexpected end of template; a block is not "
                                           "closed (expected '",
                                           end_tags.back(), "')"));
          }
          return NodePtr(body);
        default:
          return Unexpected("text, '{{' or '{%'");
      }
    }
  }

  // Cur() is the tag name.
  absl::StatusOr<NodePtr> Statement() {
    const std::string tag = Cur().text;
    const int line = Cur().line;
    Next();
    if (tag == "if") return If(line);
    if (tag == "for") return For(line);
    if (tag == "set") return Set(line);
    if (tag == "macro") return Macro(line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return SyntaxError(line, Cat("'", tag, "' outside a loop"));
      MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      return NodePtr(NewNode(tag == "break" ? NodeKind::kBreak : NodeKind::kContinue, line));
    }
    if (tag == "generation") {
      // transformers' assistant-mask extension: renders its body unchanged.
      MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      MODSERVE_ASSIGN_OR_RETURN(NodePtr body, Subparse({"endgeneration"}, &end));
      Next();
      MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      return body;
    }
    return SyntaxError(line, Cat("unknown or unsupported tag '", tag, "'"));
  }

  absl::StatusOr<NodePtr> If(int line) {
    MutableNode node = NewNode(NodeKind::kIf, line);
    for (;;) {
      MODSERVE_ASSIGN_OR_RETURN(NodePtr test, Expression());
      MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      MODSERVE_ASSIGN_OR_RETURN(NodePtr body, Subparse({"elif", "else", "endif"}, &end));
      node->children.push_back(test);
      node->children.push_back(body);
      Next();
      if (end == "elif") continue;
      if (end == "else") {
        MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
        MODSERVE_ASSIGN_OR_RETURN(NodePtr else_body, Subparse({"endif"}, &end));
        Next();
        node->children.push_back(else_body);
        node->has_else = true;
      }
      MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      return NodePtr(node);
    }
  }

  // A name, or names separated by commas (a tuple target).
  absl::StatusOr<NodePtr> AssignTarget(bool allow_attribute) {
    const int line = Cur().line;
    MODSERVE_ASSIGN_OR_RETURN(std::string first, ExpectName());
    if (allow_attribute && SkipOp(".")) {
      MODSERVE_ASSIGN_OR_RETURN(std::string attr, ExpectName());
      MutableNode target = NewNode(NodeKind::kGetattr, line);
      MutableNode object = NewNode(NodeKind::kName, line);
      object->name = first;
      target->children.push_back(object);
      target->name = attr;
      return NodePtr(target);
    }
    MutableNode name = NewNode(NodeKind::kName, line);
    name->name = first;
    if (!IsOp(",")) return NodePtr(name);
    MutableNode tuple = NewNode(NodeKind::kTuple, line);
    tuple->children.push_back(name);
    while (SkipOp(",")) {
      if (Cur().type != Tok::kName || IsName("in")) break;
      MutableNode more = NewNode(NodeKind::kName, Cur().line);
      MODSERVE_ASSIGN_OR_RETURN(more->name, ExpectName());
      tuple->children.push_back(more);
    }
    return NodePtr(tuple);
  }

  absl::StatusOr<NodePtr> For(int line) {
    MutableNode node = NewNode(NodeKind::kFor, line);
    MODSERVE_ASSIGN_OR_RETURN(NodePtr target, AssignTarget(/*allow_attribute=*/false));
    if (!SkipName("in")) return Unexpected("'in'");
    // The iterable stops before an `if` filter: no conditional expression here.
    MODSERVE_ASSIGN_OR_RETURN(NodePtr iter, Tuple(/*with_condexpr=*/false));
    NodePtr filter;
    if (SkipName("if")) {
      MODSERVE_ASSIGN_OR_RETURN(filter, Expression());
    }
    if (IsName("recursive")) return SyntaxError(Cur().line, "recursive loops are not supported");
    MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ++loop_depth_;
    absl::StatusOr<NodePtr> parsed_body = Subparse({"else", "endfor"}, &end);
    --loop_depth_;
    MODSERVE_ASSIGN_OR_RETURN(NodePtr body, std::move(parsed_body));
    Next();
    NodePtr else_body;
    if (end == "else") {
      MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      MODSERVE_ASSIGN_OR_RETURN(else_body, Subparse({"endfor"}, &end));
      Next();
    }
    MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    node->children = {target, iter, filter, body, else_body};
    return NodePtr(node);
  }

  absl::StatusOr<NodePtr> Set(int line) {
    MODSERVE_ASSIGN_OR_RETURN(NodePtr target, AssignTarget(/*allow_attribute=*/true));
    if (SkipOp("=")) {
      MutableNode node = NewNode(NodeKind::kSet, line);
      MODSERVE_ASSIGN_OR_RETURN(NodePtr value, Tuple(/*with_condexpr=*/true));
      MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      node->children = {target, value};
      return NodePtr(node);
    }
    if (target->kind != NodeKind::kName) return Unexpected("'='");
    MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    MutableNode node = NewNode(NodeKind::kSetBlock, line);
    node->name = target->name;
    std::string end;
    MODSERVE_ASSIGN_OR_RETURN(NodePtr body, Subparse({"endset"}, &end));
    Next();
    MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    node->children.push_back(body);
    return NodePtr(node);
  }

  absl::StatusOr<NodePtr> Macro(int line) {
    MutableNode node = NewNode(NodeKind::kMacro, line);
    MODSERVE_ASSIGN_OR_RETURN(node->name, ExpectName());
    MODSERVE_RETURN_IF_ERROR(ExpectOp("("));
    std::vector<NodePtr> defaults;
    while (!IsOp(")")) {
      if (!node->names.empty()) MODSERVE_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      MODSERVE_ASSIGN_OR_RETURN(std::string param, ExpectName());
      node->names.push_back(param);
      if (SkipOp("=")) {
        MODSERVE_ASSIGN_OR_RETURN(NodePtr d, Expression());
        defaults.push_back(d);
      } else if (!defaults.empty()) {
        return SyntaxError(line, "a macro parameter without a default follows one with a default");
      }
    }
    Next();
    MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    const int outer_loops = loop_depth_;
    loop_depth_ = 0;  // a macro body is not inside the loop around its definition
    absl::StatusOr<NodePtr> parsed_body = Subparse({"endmacro"}, &end);
    loop_depth_ = outer_loops;
    MODSERVE_ASSIGN_OR_RETURN(NodePtr body, std::move(parsed_body));
    Next();
    if (Cur().type == Tok::kName) Next();  // {% endmacro name %}
    MODSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    node->children.push_back(body);
    for (NodePtr &d : defaults) node->children.push_back(d);
    return NodePtr(node);
  }

  // ---- expressions

  absl::StatusOr<NodePtr> Expression() { return CondExpr(/*with_condexpr=*/true); }

  // An expression, or a tuple when commas follow (`set a, b = 1, 2`, `for x in 1, 2`).
  absl::StatusOr<NodePtr> Tuple(bool with_condexpr) {
    const int line = Cur().line;
    MODSERVE_ASSIGN_OR_RETURN(NodePtr first, CondExpr(with_condexpr));
    if (!IsOp(",")) return first;
    MutableNode tuple = NewNode(NodeKind::kTuple, line);
    tuple->children.push_back(first);
    while (SkipOp(",")) {
      if (Cur().type == Tok::kBlockEnd || Cur().type == Tok::kVarEnd || IsName("if")) break;
      MODSERVE_ASSIGN_OR_RETURN(NodePtr item, CondExpr(with_condexpr));
      tuple->children.push_back(item);
    }
    return NodePtr(tuple);
  }

  absl::StatusOr<NodePtr> CondExpr(bool with_condexpr) {
    Depth depth(this);
    if (depth.too_deep()) return SyntaxError(Cur().line, "expression nested too deeply");
    MODSERVE_ASSIGN_OR_RETURN(NodePtr expr, Or());
    while (with_condexpr && IsName("if")) {
      const int line = Cur().line;
      Next();
      MODSERVE_ASSIGN_OR_RETURN(NodePtr test, Or());
      NodePtr otherwise;
      if (SkipName("else")) {
        MODSERVE_ASSIGN_OR_RETURN(otherwise, CondExpr(true));
      }
      MutableNode node = NewNode(NodeKind::kCondExpr, line);
      node->children = {test, expr, otherwise};
      expr = node;
    }
    return expr;
  }

  absl::StatusOr<NodePtr> Or() {
    MODSERVE_ASSIGN_OR_RETURN(NodePtr left, And());
    while (IsName("or")) {
      const int line = Cur().line;
      Next();
      MODSERVE_ASSIGN_OR_RETURN(NodePtr right, And());
      MutableNode node = NewNode(NodeKind::kOr, line);
      node->children = {left, right};
      left = node;
    }
    return left;
  }

  absl::StatusOr<NodePtr> And() {
    MODSERVE_ASSIGN_OR_RETURN(NodePtr left, Not());
    while (IsName("and")) {
      const int line = Cur().line;
      Next();
      MODSERVE_ASSIGN_OR_RETURN(NodePtr right, Not());
      MutableNode node = NewNode(NodeKind::kAnd, line);
      node->children = {left, right};
      left = node;
    }
    return left;
  }

  absl::StatusOr<NodePtr> Not() {
    if (IsName("not")) {
      Depth depth(this);
      if (depth.too_deep()) return SyntaxError(Cur().line, "expression nested too deeply");
      const int line = Cur().line;
      Next();
      MODSERVE_ASSIGN_OR_RETURN(NodePtr operand, Not());
      MutableNode node = NewNode(NodeKind::kNot, line);
      node->children.push_back(operand);
      return NodePtr(node);
    }
    return Compare();
  }

  absl::StatusOr<NodePtr> Compare() {
    const int line = Cur().line;
    MODSERVE_ASSIGN_OR_RETURN(NodePtr first, Math1());
    MutableNode node;
    for (;;) {
      std::string op;
      if (Cur().type == Tok::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
           Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == Tok::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (node == nullptr) {
        node = NewNode(NodeKind::kCompare, line);
        node->children.push_back(first);
      }
      MODSERVE_ASSIGN_OR_RETURN(NodePtr operand, Math1());
      node->names.push_back(op);
      node->children.push_back(operand);
    }
    return node == nullptr ? first : NodePtr(node);
  }

  absl::StatusOr<NodePtr> Binary(NodePtr left, std::string op, NodePtr right, int line) {
    MutableNode node = NewNode(NodeKind::kBinary, line);
    node->name = std::move(op);
    node->children = {std::move(left), std::move(right)};
    return NodePtr(node);
  }

  absl::StatusOr<NodePtr> Math1() {
    MODSERVE_ASSIGN_OR_RETURN(NodePtr left, Concat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Next();
      MODSERVE_ASSIGN_OR_RETURN(NodePtr right, Concat());
      MODSERVE_ASSIGN_OR_RETURN(left, Binary(left, op, right, line));
    }
    return left;
  }

  absl::StatusOr<NodePtr> Concat() {
    const int line = Cur().line;
    MODSERVE_ASSIGN_OR_RETURN(NodePtr first, Math2());
    if (!IsOp("~")) return first;
    MutableNode node = NewNode(NodeKind::kConcat, line);
    node->children.push_back(first);
    while (SkipOp("~")) {
      MODSERVE_ASSIGN_OR_RETURN(NodePtr part, Math2());
      node->children.push_back(part);
    }
    return NodePtr(node);
  }

  absl::StatusOr<NodePtr> Math2() {
    MODSERVE_ASSIGN_OR_RETURN(NodePtr left, Pow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Next();
      MODSERVE_ASSIGN_OR_RETURN(NodePtr right, Pow());
      MODSERVE_ASSIGN_OR_RETURN(left, Binary(left, op, right, line));
    }
    return left;
  }

  absl::StatusOr<NodePtr> Pow() {
    MODSERVE_ASSIGN_OR_RETURN(NodePtr left, Unary(/*with_filter=*/true));
    while (IsOp("**")) {
      const int line = Cur().line;
      Next();
      MODSERVE_ASSIGN_OR_RETURN(NodePtr right, Unary(/*with_filter=*/true));
      MODSERVE_ASSIGN_OR_RETURN(left, Binary(left, "**", right, line));
    }
    return left;
  }

  absl::StatusOr<NodePtr> Unary(bool with_filter) {
    Depth depth(this);
    if (depth.too_deep()) return SyntaxError(Cur().line, "expression nested too deeply");
    const int line = Cur().line;
    NodePtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Next();
      MODSERVE_ASSIGN_OR_RETURN(NodePtr operand, Unary(/*with_filter=*/false));
      MutableNode n = NewNode(neg ? NodeKind::kNeg : NodeKind::kPos, line);
      n->children.push_back(operand);
      node = n;
    } else {
      MODSERVE_ASSIGN_OR_RETURN(node, Primary());
    }
    MODSERVE_ASSIGN_OR_RETURN(node, Postfix(node));
    if (with_filter) {
      MODSERVE_ASSIGN_OR_RETURN(node, FilterExpr(node));
    }
    return node;
  }

  absl::StatusOr<NodePtr> Primary() {
    const Token &t = Cur();
    const int line = t.line;
    switch (t.type) {
      case Tok::kName: {
        MutableNode n;
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          n = NewNode(NodeKind::kConst, line);
          n->value = Value::Bool(t.text == "true" || t.text == "True");
        } else if (t.text == "none" || t.text == "None") {
          n = NewNode(NodeKind::kConst, line);
          n->value = Value::None();
        } else {
          n = NewNode(NodeKind::kName, line);
          n->name = t.text;
        }
        Next();
        return NodePtr(n);
      }
      case Tok::kString: {
        std::string text = t.text;
        Next();
        while (Cur().type == Tok::kString) {  // adjacent literals concatenate
          text += Cur().text;
          Next();
        }
        MutableNode n = NewNode(NodeKind::kConst, line);
        n->value = Value::String(std::move(text));
        return NodePtr(n);
      }
      case Tok::kInt:
      case Tok::kFloat: {
        MutableNode n = NewNode(NodeKind::kConst, line);
        n->value = t.number;
        Next();
        return NodePtr(n);
      }
      case Tok::kOp:
        if (t.text == "(") {
          Next();
          if (SkipOp(")")) return NodePtr(NewNode(NodeKind::kTuple, line));
          MODSERVE_ASSIGN_OR_RETURN(NodePtr first, Expression());
          if (SkipOp(")")) return first;
          MutableNode tuple = NewNode(NodeKind::kTuple, line);
          tuple->children.push_back(first);
          while (SkipOp(",")) {
            if (IsOp(")")) break;
            MODSERVE_ASSIGN_OR_RETURN(NodePtr item, Expression());
            tuple->children.push_back(item);
          }
          MODSERVE_RETURN_IF_ERROR(ExpectOp(")"));
          return NodePtr(tuple);
        }
        if (t.text == "[") {
          Next();
          MutableNode list = NewNode(NodeKind::kList, line);
          while (!IsOp("]")) {
            if (!list->children.empty()) MODSERVE_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            MODSERVE_ASSIGN_OR_RETURN(NodePtr item, Expression());
            list->children.push_back(item);
          }
          Next();
          return NodePtr(list);
        }
        if (t.text == "{") {
          Next();
          MutableNode dict = NewNode(NodeKind::kDict, line);
          while (!IsOp("}")) {
            if (!dict->children.empty()) MODSERVE_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            MODSERVE_ASSIGN_OR_RETURN(NodePtr key, Expression());
            MODSERVE_RETURN_IF_ERROR(ExpectOp(":"));
            MODSERVE_ASSIGN_OR_RETURN(NodePtr value, Expression());
            dict->children.push_back(key);
            dict->children.push_back(value);
          }
          Next();
          return NodePtr(dict);
        }
        break;
      default:
        break;
    }
    return Unexpected("an expression");
  }

  absl::StatusOr<NodePtr> Postfix(NodePtr node) {
    for (;;) {
      if (IsOp(".") || IsOp("[")) {
        MODSERVE_ASSIGN_OR_RETURN(node, Subscript(node));
      } else if (IsOp("(")) {
        MODSERVE_ASSIGN_OR_RETURN(node, Call(node));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<NodePtr> FilterExpr(NodePtr node) {
    for (;;) {
      if (IsOp("|")) {
        MODSERVE_ASSIGN_OR_RETURN(node, Filter(node));
      } else if (IsName("is")) {
        MODSERVE_ASSIGN_OR_RETURN(node, Test(node));
      } else if (IsOp("(")) {
        MODSERVE_ASSIGN_OR_RETURN(node, Call(node));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<NodePtr> Subscript(NodePtr object) {
    const int line = Cur().line;
    if (SkipOp(".")) {
      if (Cur().type == Tok::kName) {
        MutableNode n = NewNode(NodeKind::kGetattr, line);
        n->children.push_back(object);
        n->name = Cur().text;
        Next();
        return NodePtr(n);
      }
      if (Cur().type == Tok::kInt) {
        MutableNode key = NewNode(NodeKind::kConst, line);
        key->value = Cur().number;
        Next();
        MutableNode n = NewNode(NodeKind::kGetitem, line);
        n->children = {object, key};
        return NodePtr(n);
      }
      return Unexpected("an attribute name");
    }
    Next();  // '['
    NodePtr parts[3];
    bool is_slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!IsOp(":") && !IsOp("]")) {
        MODSERVE_ASSIGN_OR_RETURN(parts[k], Expression());
      }
      if (k < 2 && SkipOp(":")) {
        is_slice = true;
        continue;
      }
      break;
    }
    MODSERVE_RETURN_IF_ERROR(ExpectOp("]"));
    if (!is_slice) {
      if (parts[0] == nullptr) return SyntaxError(line, "empty subscript");
      MutableNode n = NewNode(NodeKind::kGetitem, line);
      n->children = {object, parts[0]};
      return NodePtr(n);
    }
    MutableNode n = NewNode(NodeKind::kSlice, line);
    n->children = {object, parts[0], parts[1], parts[2]};
    return NodePtr(n);
  }

  // Arguments "(a, b, k=v)" into `node` (children after the first) and node->names.
  absl::Status Arguments(MutableNode &node) {
    MODSERVE_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) MODSERVE_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().text == "=") {
        node->names.push_back(Cur().text);
        Next();
        Next();
        MODSERVE_ASSIGN_OR_RETURN(NodePtr value, Expression());
        node->children.push_back(value);
        continue;
      }
      if (!node->names.empty()) {
        return SyntaxError(Cur().line, "a positional argument follows a keyword argument");
      }
      if (IsOp("*") || IsOp("**")) return SyntaxError(Cur().line, "*args are not supported");
      MODSERVE_ASSIGN_OR_RETURN(NodePtr value, Expression());
      node->children.push_back(value);
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<NodePtr> Call(NodePtr callee) {
    MutableNode n = NewNode(NodeKind::kCall, Cur().line);
    n->children.push_back(callee);
    MODSERVE_RETURN_IF_ERROR(Arguments(n));
    return NodePtr(n);
  }

  // A dotted filter or test name.
  absl::StatusOr<std::string> DottedName() {
    MODSERVE_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".") && Peek().type == Tok::kName) {
      Next();
      absl::StrAppend(&name, ".", Cur().text);
      Next();
    }
    return name;
  }

  absl::StatusOr<NodePtr> Filter(NodePtr operand) {
    while (IsOp("|")) {
      const int line = Cur().line;
      Next();
      MutableNode n = NewNode(NodeKind::kFilter, line);
      MODSERVE_ASSIGN_OR_RETURN(n->name, DottedName());
      n->children.push_back(operand);
      if (IsOp("(")) MODSERVE_RETURN_IF_ERROR(Arguments(n));
      operand = n;
    }
    return operand;
  }

  absl::StatusOr<NodePtr> Test(NodePtr operand) {
    const int line = Cur().line;
    Next();  // 'is'
    MutableNode n = NewNode(NodeKind::kTest, line);
    n->negated = SkipName("not");
    MODSERVE_ASSIGN_OR_RETURN(n->name, DottedName());
    n->children.push_back(operand);
    if (IsOp("(")) {
      MODSERVE_RETURN_IF_ERROR(Arguments(n));
    } else if (Cur().type == Tok::kString || Cur().type == Tok::kInt || Cur().type == Tok::kFloat ||
               IsOp("[") || IsOp("{") ||
               (Cur().type == Tok::kName && !IsName("else") && !IsName("or") && !IsName("and"))) {
      // One argument without parentheses: `is divisibleby 3`, `is sameas none`.
      if (IsName("is")) return SyntaxError(Cur().line, "tests cannot be chained with 'is'");
      MODSERVE_ASSIGN_OR_RETURN(NodePtr arg, Primary());
      MODSERVE_ASSIGN_OR_RETURN(arg, Postfix(arg));
      n->children.push_back(arg);
    }
    return NodePtr(n);
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Renderer

namespace {

constexpr absl::string_view kRaisePayload = "type.modserve/jinja.raise_exception";
// The sandbox's MAX_RANGE: jinja2 refuses larger ranges too.
constexpr int64_t kMaxRange = 100000;

struct Frame {
  absl::flat_hash_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};
using FramePtr = std::shared_ptr<Frame>;

// What `loop.*` reads; one per iteration, the items shared by all of them.
struct LoopState {
  int64_t index0;
  std::shared_ptr<const std::vector<Value>> items;
};

const Value *Lookup(const Frame *f, std::string_view name) {
  for (; f != nullptr; f = f->parent.get()) {
    auto it = f->vars.find(absl::string_view(name.data(), name.size()));
    if (it != f->vars.end()) return &it->second;
  }
  return nullptr;
}

std::string TypeName(const Value &v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kTuple:
      return "tuple";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunction:
      return "function";
    case Value::Kind::kLoop:
      return "LoopContext";
  }
  return "object";
}

std::string UndefinedMessage(const Value &v) {
  return v.undefined_name().empty() ? "a value is undefined"
                                    : Cat("'", v.undefined_name(), "' is undefined");
}

bool Equals(const Value &a, const Value &b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kList:
    case K::kTuple: {
      const auto &x = a.as_list();
      const auto &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      const Dict &x = a.as_dict();
      const Dict &y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto &[key, value] : x.items()) {
        const Value *other = y.Find(key);
        if (other == nullptr || !Equals(value, *other)) return false;
      }
      return true;
    }
    case K::kNamespace:
    case K::kFunction:
      return a.identity() == b.identity();
    default:
      return false;
  }
}

// -1, 0 or 1; TypeError (InvalidArgument) when Python refuses to order the two.
absl::StatusOr<int> Order(const Value &a, const Value &b, std::string_view op) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) {
      const double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // UTF-8 byte order = code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_sequence() && a.kind() == b.kind()) {
    const auto &x = a.as_list();
    const auto &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Order(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return absl::InvalidArgumentError(Cat("'", op, "' not supported between instances of '",
                                        TypeName(a), "' and '", TypeName(b), "'"));
}

// Python's for-iteration: list and tuple items, dict keys, the characters of a string; an Undefined
// iterates as empty (jinja2).
absl::StatusOr<std::vector<Value>> Iterate(const Value &v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return v.as_list();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto &item : v.as_dict().items()) keys.push_back(Value::String(item.first));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : DecodeUtf8(v.as_string())) {
        std::string s;
        AppendCodePoint(c, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    default:
      return absl::InvalidArgumentError(Cat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<bool> Contains(const Value &container, const Value &item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return absl::InvalidArgumentError(
            Cat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value &x : container.as_list()) {
        if (Equals(x, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return item.is_string() && container.as_dict().Find(item.as_string()) != nullptr;
    default:
      return absl::InvalidArgumentError(
          Cat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value &v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePointCount(v.as_string()));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.as_dict().size());
    default:
      return absl::InvalidArgumentError(Cat("object of type '", TypeName(v), "' has no len()"));
  }
}

// Python's slice index adjustment (PySlice_AdjustIndices).
std::vector<int64_t> SliceIndices(int64_t n, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  auto adjust = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  const int64_t b = adjust(start, step < 0 ? n - 1 : 0);
  const int64_t e = adjust(stop, step < 0 ? -1 : n);
  std::vector<int64_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(i);
  return out;
}

}  // namespace

class Renderer {
 public:
  explicit Renderer(const RenderLimits &limits) : limits_(limits) {}

  absl::Status Exec(const Node &n, const FramePtr &f, std::string *out);
  absl::StatusOr<Value> Eval(const Node &n, const FramePtr &f);

  // Filters and bound methods call back into these.
  absl::StatusOr<Value> ApplyFilter(const Node *at, std::string_view name, const Value &operand,
                                    CallArgs &args);
  absl::StatusOr<bool> ApplyTest(std::string_view name, const Value &operand, CallArgs &args);
  absl::StatusOr<Value> GetItem(const Value &object, const Value &key);
  absl::StatusOr<Value> GetAttr(const Value &object, const std::string &name);
  absl::Status CheckSize(size_t bytes) const {
    if (static_cast<int64_t>(bytes) > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(Cat("template: a value of ", bytes,
                                              " bytes exceeds the render limit of ",
                                              limits_.max_output_bytes));
    }
    return absl::OkStatus();
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status Step() {
    if (++steps_ > limits_.max_steps) {
      return absl::ResourceExhaustedError(
          Cat("template: more than ", limits_.max_steps, " evaluation steps"));
    }
    return absl::OkStatus();
  }
  absl::Status Append(std::string *out, std::string_view text) {
    output_bytes_ += static_cast<int64_t>(text.size());
    if (output_bytes_ > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(
          Cat("template: output exceeds ", limits_.max_output_bytes, " bytes"));
    }
    out->append(text);
    return absl::OkStatus();
  }
  static absl::Status AtLine(const Node &n, const absl::Status &s) {
    if (s.ok() || IsRaisedByTemplate(s) || absl::IsResourceExhausted(s) ||
        absl::StartsWith(s.message(), "template line ")) {
      return s;
    }
    return absl::Status(s.code(), Cat("template line ", n.line, ": ", s.message()));
  }

  absl::StatusOr<CallArgs> EvalArgs(const Node &n, size_t first, const FramePtr &f);
  absl::Status Assign(const Node &target, const Value &value, const FramePtr &f);
  absl::Status ExecFor(const Node &n, const FramePtr &f, std::string *out);
  absl::StatusOr<Value> CallMacro(const Node &macro, const std::weak_ptr<Frame> &scope,
                                  CallArgs &args);
  absl::StatusOr<Value> Arith(const std::string &op, const Value &a, const Value &b);
  absl::StatusOr<Value> Slice(const Value &object, const Node &n, const FramePtr &f);
  absl::StatusOr<Value> Method(const Value &self, const std::string &name, CallArgs &args);

  const RenderLimits limits_;
  int64_t steps_ = 0;
  int64_t output_bytes_ = 0;
  int32_t call_depth_ = 0;
  Flow flow_ = Flow::kNormal;
};

namespace {

// Python-style binding of a builtin's arguments; absent optional parameters stay nullopt.
absl::StatusOr<std::vector<std::optional<Value>>> Bind(
    std::string_view what, const CallArgs &args, std::initializer_list<std::string_view> params,
    size_t num_required = 0) {
  std::vector<std::optional<Value>> out(params.size());
  const std::vector<std::string_view> names(params);
  if (args.positional.size() > names.size()) {
    return absl::InvalidArgumentError(Cat(what, "() takes at most ", names.size(), " arguments (",
                                          args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto &[key, value] : args.keyword) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) {
      return absl::InvalidArgumentError(
          Cat(what, "() got an unexpected keyword argument '", key, "'"));
    }
    auto &slot = out[it - names.begin()];
    if (slot) {
      return absl::InvalidArgumentError(
          Cat(what, "() got multiple values for argument '", key, "'"));
    }
    slot = value;
  }
  for (size_t i = 0; i < num_required; ++i) {
    if (!out[i]) {
      return absl::InvalidArgumentError(Cat(what, "() missing required argument '", names[i], "'"));
    }
  }
  return out;
}

absl::StatusOr<int64_t> IntArg(std::string_view what, const Value &v) {
  if (v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool) return v.as_int();
  return absl::InvalidArgumentError(
      Cat(what, ": '", TypeName(v), "' object cannot be interpreted as an integer"));
}

absl::StatusOr<std::string> StrArg(std::string_view what, const Value &v) {
  if (v.is_string()) return v.as_string();
  return absl::InvalidArgumentError(Cat(what, ": expected a string, got '", TypeName(v), "'"));
}

// An optional string argument where None means absent (str.strip(None), str.split(None)).
absl::StatusOr<std::optional<std::string>> OptStrArg(std::string_view what,
                                                     const std::optional<Value> &v) {
  if (!v || v->is_none()) return std::optional<std::string>();
  MODSERVE_ASSIGN_OR_RETURN(std::string s, StrArg(what, *v));
  return std::optional<std::string>(std::move(s));
}

Value MakeTuple2(Value a, Value b) {
  std::vector<Value> items;
  items.push_back(std::move(a));
  items.push_back(std::move(b));
  return Value::Tuple(std::move(items));
}

// Python's round(x, ndigits) for floats: correctly rounded, ties to even on the exact value (printf
// rounds the exact binary value the same way).
double RoundHalfEven(double x, int64_t ndigits) {
  if (!std::isfinite(x) || ndigits > 300) return x;
  if (ndigits < 0) {
    const double p = std::pow(10.0, static_cast<double>(-ndigits));
    return std::nearbyint(x / p) * p;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
  return std::strtod(buf, nullptr);
}

// Python's int(str, base) (whitespace and single underscores allowed).
std::optional<int64_t> ParsePythonInt(std::string_view text, int base) {
  std::string s = PythonStrip(text, std::nullopt, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  std::string digits;
  bool last_underscore = true;
  for (; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (last_underscore) return std::nullopt;
      last_underscore = true;
      continue;
    }
    digits.push_back(s[i]);
    last_underscore = false;
  }
  if (digits.empty() || last_underscore) return std::nullopt;
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;
  return negative ? -value : value;
}

std::optional<double> ParsePythonFloat(std::string_view text) {
  const std::string s = PythonStrip(text, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  char *end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

absl::StatusOr<CallArgs> Renderer::EvalArgs(const Node &n, size_t first, const FramePtr &f) {
  CallArgs args;
  const size_t num_keyword = n.names.size();
  const size_t num_positional = n.children.size() - first - num_keyword;
  for (size_t i = 0; i < num_positional; ++i) {
    MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*n.children[first + i], f));
    args.positional.push_back(std::move(v));
  }
  for (size_t k = 0; k < num_keyword; ++k) {
    MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*n.children[first + num_positional + k], f));
    args.keyword.emplace_back(n.names[k], std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Renderer::GetAttr(const Value &object, const std::string &name) {
  static constexpr std::string_view kStringMethods[] = {
      "strip", "lstrip",     "rstrip",  "split",   "startswith", "endswith", "upper",  "lower",
      "title", "capitalize", "replace", "find",    "rfind",      "index",    "rindex", "count",
      "join",  "isdigit",    "isalpha", "isalnum", "isspace",    "islower",  "isupper"};
  static constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get"};
  // Python attributes of the types that the immutable sandbox refuses (they mutate).
  static constexpr std::string_view kMutators[] = {"append", "extend",     "insert", "pop",
                                                   "remove", "clear",      "sort",   "reverse",
                                                   "update", "setdefault", "popitem"};
  auto method = [&](std::string_view n) {
    Value self = object;
    std::string method_name(n);
    return Value::Callable(method_name, [self, method_name](Renderer &r, CallArgs &args) {
      return r.Method(self, method_name, args);
    });
  };
  if (object.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(object));
  if (!name.empty() && name[0] == '_') return Value::Undefined(name);  // sandbox: no privates
  switch (object.kind()) {
    case Value::Kind::kString:
      for (std::string_view m : kStringMethods) {
        if (m == name) return method(m);
      }
      return Value::Undefined(name);
    case Value::Kind::kDict: {
      for (std::string_view m : kDictMethods) {
        if (m == name) return method(m);
      }
      for (std::string_view m : kMutators) {
        if (m == name) return Value::Undefined(name);
      }
      const Value *v = object.as_dict().Find(name);
      return v != nullptr ? *v : Value::Undefined(name);
    }
    case Value::Kind::kNamespace: {
      const Value *v = object.as_dict().Find(name);
      return v != nullptr ? *v : Value::Undefined(name);
    }
    case Value::Kind::kLoop: {
      const auto &loop = *static_cast<const LoopState *>(object.identity());
      const int64_t i = loop.index0;
      const int64_t n = static_cast<int64_t>(loop.items->size());
      if (name == "index") return Value::Int(i + 1);
      if (name == "index0") return Value::Int(i);
      if (name == "revindex") return Value::Int(n - i);
      if (name == "revindex0") return Value::Int(n - i - 1);
      if (name == "first") return Value::Bool(i == 0);
      if (name == "last") return Value::Bool(i == n - 1);
      if (name == "length") return Value::Int(n);
      if (name == "depth") return Value::Int(1);
      if (name == "depth0") return Value::Int(0);
      if (name == "previtem") return i > 0 ? (*loop.items)[i - 1] : Value::Undefined(name);
      if (name == "nextitem") return i + 1 < n ? (*loop.items)[i + 1] : Value::Undefined(name);
      if (name == "cycle") {
        return Value::Callable("cycle", [i](Renderer &, CallArgs &args) -> absl::StatusOr<Value> {
          if (args.positional.empty())
            return absl::InvalidArgumentError("no items for cycling given");
          return args.positional[i % static_cast<int64_t>(args.positional.size())];
        });
      }
      return Value::Undefined(name);
    }
    default:
      return Value::Undefined(name);
  }
}

absl::StatusOr<Value> Renderer::GetItem(const Value &object, const Value &key) {
  if (object.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(object));
  const bool int_key = key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool;
  switch (object.kind()) {
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (int_key) {
        const auto &items = object.as_list();
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value::Undefined();
        return items[i];
      }
      break;
    case Value::Kind::kString:
      if (int_key) {
        const std::vector<char32_t> cps = DecodeUtf8(object.as_string());
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(cps.size());
        if (i < 0 || i >= static_cast<int64_t>(cps.size())) return Value::Undefined();
        std::string s;
        AppendCodePoint(cps[i], &s);
        return Value::String(std::move(s));
      }
      break;
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      if (key.is_string()) {
        const Value *v = object.as_dict().Find(key.as_string());
        if (v != nullptr) return *v;
      }
      break;
    default:
      break;
  }
  // jinja2: a failed subscript by a string falls back to the attribute (d['items'] is the method).
  if (key.is_string()) return GetAttr(object, key.as_string());
  return Value::Undefined();
}

absl::StatusOr<Value> Renderer::Slice(const Value &object, const Node &n, const FramePtr &f) {
  std::optional<int64_t> bounds[3];
  for (int k = 0; k < 3; ++k) {
    if (n.children[k + 1] == nullptr) continue;
    MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*n.children[k + 1], f));
    if (v.is_none()) continue;
    MODSERVE_ASSIGN_OR_RETURN(bounds[k], IntArg("slice", v));
  }
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  if (object.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(object));
  if (object.is_string()) {
    const std::vector<char32_t> cps = DecodeUtf8(object.as_string());
    std::string out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(cps.size()), bounds[0], bounds[1], step)) {
      AppendCodePoint(cps[i], &out);
    }
    return Value::String(std::move(out));
  }
  if (object.is_sequence()) {
    const auto &items = object.as_list();
    std::vector<Value> out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(items.size()), bounds[0], bounds[1], step)) {
      out.push_back(items[i]);
    }
    return object.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(out))
                                                : Value::List(std::move(out));
  }
  return Value::Undefined();
}

absl::StatusOr<Value> Renderer::Arith(const std::string &op, const Value &a, const Value &b) {
  using K = Value::Kind;
  if (a.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(a));
  if (b.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(b));
  auto unsupported = [&] {
    return absl::InvalidArgumentError(Cat("unsupported operand type(s) for ", op, ": '",
                                          TypeName(a), "' and '", TypeName(b), "'"));
  };
  if (a.is_number() && b.is_number()) {
    const bool floats = a.kind() == K::kFloat || b.kind() == K::kFloat;
    if (op == "/") {
      if (b.as_float() == 0.0) return absl::InvalidArgumentError("division by zero");
      return Value::Float(a.as_float() / b.as_float());
    }
    if (floats) {
      const double x = a.as_float(), y = b.as_float();
      if (op == "+") return Value::Float(x + y);
      if (op == "-") return Value::Float(x - y);
      if (op == "*") return Value::Float(x * y);
      if (op == "**") return Value::Float(std::pow(x, y));
      if (y == 0.0) return absl::InvalidArgumentError("float division by zero");
      if (op == "//") return Value::Float(std::floor(x / y));
      // Python's float %: the result takes the divisor's sign.
      double m = std::fmod(x, y);
      if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    auto overflow = [] { return absl::InvalidArgumentError("integer overflow"); };
    if (op == "+") {
      if (__builtin_add_overflow(x, y, &r)) return overflow();
      return Value::Int(r);
    }
    if (op == "-") {
      if (__builtin_sub_overflow(x, y, &r)) return overflow();
      return Value::Int(r);
    }
    if (op == "*") {
      if (__builtin_mul_overflow(x, y, &r)) return overflow();
      return Value::Int(r);
    }
    if (op == "**") {
      if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
      // Square and multiply; a squaring that overflows is always used by a later bit.
      int64_t base = x, e = y;
      r = 1;
      while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return overflow();
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) return overflow();
      }
      return Value::Int(r);
    }
    if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) return overflow();
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {  // floor, as Python does
      --q;
      m += y;
    }
    if (op == "//") return Value::Int(q);
    if (op == "%") return Value::Int(m);
    return unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      MODSERVE_RETURN_IF_ERROR(CheckSize(a.as_string().size() + b.as_string().size()));
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      std::vector<Value> items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return a.kind() == K::kTuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
    }
    if (a.is_string() || b.is_string()) {
      return absl::InvalidArgumentError(
          Cat("can only concatenate str (not \"", TypeName(a.is_string() ? b : a), "\") to str"));
    }
    return unsupported();
  }
  if (op == "*") {
    const Value *seq = a.is_string() || a.is_sequence() ? &a : &b;
    const Value *count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_sequence()) &&
        (count->kind() == K::kInt || count->kind() == K::kBool)) {
      const int64_t times = std::max<int64_t>(0, count->as_int());
      if (seq->is_string()) {
        MODSERVE_RETURN_IF_ERROR(CheckSize(seq->as_string().size() * static_cast<size_t>(times)));
        std::string out;
        for (int64_t k = 0; k < times; ++k) out += seq->as_string();
        return Value::String(std::move(out));
      }
      MODSERVE_RETURN_IF_ERROR(CheckSize(seq->as_list().size() * static_cast<size_t>(times)));
      std::vector<Value> out;
      for (int64_t k = 0; k < times; ++k) {
        out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
      }
      return seq->kind() == K::kTuple ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
    }
  }
  return unsupported();
}

absl::StatusOr<Value> Renderer::Eval(const Node &n, const FramePtr &f) {
  MODSERVE_RETURN_IF_ERROR(Step());
  switch (n.kind) {
    case NodeKind::kConst:
      return n.value;
    case NodeKind::kName: {
      const Value *v = Lookup(f.get(), n.name);
      return v != nullptr ? *v : Value::Undefined(n.name);
    }
    case NodeKind::kList:
    case NodeKind::kTuple: {
      std::vector<Value> items;
      for (const NodePtr &c : n.children) {
        MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*c, f));
        items.push_back(std::move(v));
      }
      return n.kind == NodeKind::kTuple ? Value::Tuple(std::move(items))
                                        : Value::List(std::move(items));
    }
    case NodeKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < n.children.size(); i += 2) {
        MODSERVE_ASSIGN_OR_RETURN(Value key, Eval(*n.children[i], f));
        if (!key.is_string()) {
          return AtLine(n, absl::InvalidArgumentError("dict keys must be strings here"));
        }
        MODSERVE_ASSIGN_OR_RETURN(Value value, Eval(*n.children[i + 1], f));
        d.Set(key.as_string(), std::move(value));
      }
      return Value::FromDict(std::move(d));
    }
    case NodeKind::kGetattr: {
      MODSERVE_ASSIGN_OR_RETURN(Value object, Eval(*n.children[0], f));
      absl::StatusOr<Value> v = GetAttr(object, n.name);
      if (!v.ok()) return AtLine(n, v.status());
      return v;
    }
    case NodeKind::kGetitem: {
      MODSERVE_ASSIGN_OR_RETURN(Value object, Eval(*n.children[0], f));
      MODSERVE_ASSIGN_OR_RETURN(Value key, Eval(*n.children[1], f));
      absl::StatusOr<Value> v = GetItem(object, key);
      if (!v.ok()) return AtLine(n, v.status());
      return v;
    }
    case NodeKind::kSlice: {
      MODSERVE_ASSIGN_OR_RETURN(Value object, Eval(*n.children[0], f));
      absl::StatusOr<Value> v = Slice(object, n, f);
      if (!v.ok()) return AtLine(n, v.status());
      return v;
    }
    case NodeKind::kCall: {
      MODSERVE_ASSIGN_OR_RETURN(Value callee, Eval(*n.children[0], f));
      if (callee.is_undefined()) {
        return AtLine(n, absl::InvalidArgumentError(UndefinedMessage(callee)));
      }
      if (callee.kind() != Value::Kind::kFunction) {
        return AtLine(
            n, absl::InvalidArgumentError(Cat("'", TypeName(callee), "' object is not callable")));
      }
      MODSERVE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(n, 1, f));
      absl::StatusOr<Value> v = callee.as_function()(*this, args);
      if (!v.ok()) return AtLine(n, v.status());
      return v;
    }
    case NodeKind::kFilter: {
      MODSERVE_ASSIGN_OR_RETURN(Value operand, Eval(*n.children[0], f));
      MODSERVE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(n, 1, f));
      absl::StatusOr<Value> v = ApplyFilter(&n, n.name, operand, args);
      if (!v.ok()) return AtLine(n, v.status());
      return v;
    }
    case NodeKind::kTest: {
      MODSERVE_ASSIGN_OR_RETURN(Value operand, Eval(*n.children[0], f));
      MODSERVE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(n, 1, f));
      absl::StatusOr<bool> b = ApplyTest(n.name, operand, args);
      if (!b.ok()) return AtLine(n, b.status());
      return Value::Bool(*b != n.negated);
    }
    case NodeKind::kNeg:
    case NodeKind::kPos: {
      MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*n.children[0], f));
      if (v.is_undefined()) return AtLine(n, absl::InvalidArgumentError(UndefinedMessage(v)));
      if (!v.is_number()) {
        return AtLine(n, absl::InvalidArgumentError(Cat("bad operand type for unary ",
                                                        n.kind == NodeKind::kNeg ? "-" : "+", ": '",
                                                        TypeName(v), "'")));
      }
      if (n.kind == NodeKind::kPos) {
        return v.kind() == Value::Kind::kFloat ? v : Value::Int(v.as_int());
      }
      if (v.kind() == Value::Kind::kFloat) return Value::Float(-v.as_float());
      if (v.as_int() == INT64_MIN) return AtLine(n, absl::InvalidArgumentError("integer overflow"));
      return Value::Int(-v.as_int());
    }
    case NodeKind::kNot: {
      MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*n.children[0], f));
      return Value::Bool(!v.Truthy());
    }
    case NodeKind::kBinary: {
      MODSERVE_ASSIGN_OR_RETURN(Value a, Eval(*n.children[0], f));
      MODSERVE_ASSIGN_OR_RETURN(Value b, Eval(*n.children[1], f));
      absl::StatusOr<Value> v = Arith(n.name, a, b);
      if (!v.ok()) return AtLine(n, v.status());
      return v;
    }
    case NodeKind::kAnd: {
      MODSERVE_ASSIGN_OR_RETURN(Value a, Eval(*n.children[0], f));
      if (!a.Truthy()) return a;
      return Eval(*n.children[1], f);
    }
    case NodeKind::kOr: {
      MODSERVE_ASSIGN_OR_RETURN(Value a, Eval(*n.children[0], f));
      if (a.Truthy()) return a;
      return Eval(*n.children[1], f);
    }
    case NodeKind::kCompare: {
      MODSERVE_ASSIGN_OR_RETURN(Value left, Eval(*n.children[0], f));
      for (size_t k = 0; k < n.names.size(); ++k) {
        MODSERVE_ASSIGN_OR_RETURN(Value right, Eval(*n.children[k + 1], f));
        const std::string &op = n.names[k];
        bool result;
        if (op == "==" || op == "!=") {
          result = Equals(left, right) == (op == "==");
        } else if (op == "in" || op == "notin") {
          absl::StatusOr<bool> in = Contains(right, left);
          if (!in.ok()) return AtLine(n, in.status());
          result = *in == (op == "in");
        } else {
          if (left.is_undefined() || right.is_undefined()) {
            return AtLine(n, absl::InvalidArgumentError(
                                 UndefinedMessage(left.is_undefined() ? left : right)));
          }
          absl::StatusOr<int> c = Order(left, right, op);
          if (!c.ok()) return AtLine(n, c.status());
          result = op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0;
        }
        if (!result) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case NodeKind::kCondExpr: {
      MODSERVE_ASSIGN_OR_RETURN(Value test, Eval(*n.children[0], f));
      if (test.Truthy()) return Eval(*n.children[1], f);
      if (n.children[2] == nullptr) return Value::Undefined();
      return Eval(*n.children[2], f);
    }
    case NodeKind::kConcat: {
      std::string out;
      for (const NodePtr &c : n.children) {
        MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*c, f));
        out += Str(v);
        MODSERVE_RETURN_IF_ERROR(CheckSize(out.size()));
      }
      return Value::String(std::move(out));
    }
    default:
      return AtLine(n, absl::InternalError("a statement evaluated as an expression"));
  }
}

absl::Status Renderer::Assign(const Node &target, const Value &value, const FramePtr &f) {
  if (target.kind == NodeKind::kName) {
    f->vars[target.name] = value;
    return absl::OkStatus();
  }
  if (target.kind == NodeKind::kGetattr) {
    const Value *ns = Lookup(f.get(), target.children[0]->name);
    if (ns == nullptr || ns->kind() != Value::Kind::kNamespace) {
      return AtLine(target, absl::InvalidArgumentError(
                                Cat("cannot assign attribute on non-namespace object '",
                                    target.children[0]->name, "'")));
    }
    ns->mutable_namespace().Set(target.name, value);
    return absl::OkStatus();
  }
  // A tuple of names: unpack like Python.
  absl::StatusOr<std::vector<Value>> items = Iterate(value);
  if (!items.ok() || value.is_undefined()) {
    return AtLine(target,
                  absl::InvalidArgumentError(Cat("cannot unpack a '", TypeName(value), "'")));
  }
  if (items->size() != target.children.size()) {
    return AtLine(target,
                  absl::InvalidArgumentError(Cat("cannot unpack ", items->size(), " values into ",
                                                 target.children.size(), " names")));
  }
  for (size_t i = 0; i < items->size(); ++i) {
    f->vars[target.children[i]->name] = (*items)[i];
  }
  return absl::OkStatus();
}

absl::Status Renderer::ExecFor(const Node &n, const FramePtr &f, std::string *out) {
  const Node &target = *n.children[0];
  MODSERVE_ASSIGN_OR_RETURN(Value iterable, Eval(*n.children[1], f));
  absl::StatusOr<std::vector<Value>> all = Iterate(iterable);
  if (!all.ok()) return AtLine(n, all.status());
  std::vector<Value> items;
  if (n.children[2] != nullptr) {
    // The `if` filter sees the loop target (but no `loop`); indices count kept items only.
    for (Value &item : *all) {
      auto scope = std::make_shared<Frame>();
      scope->parent = f;
      MODSERVE_RETURN_IF_ERROR(Assign(target, item, scope));
      MODSERVE_ASSIGN_OR_RETURN(Value keep, Eval(*n.children[2], scope));
      if (keep.Truthy()) items.push_back(std::move(item));
    }
  } else {
    items = *std::move(all);
  }
  if (items.empty()) {
    if (n.children[4] != nullptr) return Exec(*n.children[4], f, out);
    return absl::OkStatus();
  }
  const int64_t length = static_cast<int64_t>(items.size());
  auto shared = std::make_shared<const std::vector<Value>>(std::move(items));
  for (int64_t i = 0; i < length; ++i) {
    auto scope = std::make_shared<Frame>();
    scope->parent = f;
    MODSERVE_RETURN_IF_ERROR(Assign(target, (*shared)[i], scope));
    scope->vars["loop"] = Value::Loop(std::make_shared<const LoopState>(LoopState{i, shared}));
    MODSERVE_RETURN_IF_ERROR(Exec(*n.children[3], scope, out));
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Renderer::CallMacro(const Node &macro, const std::weak_ptr<Frame> &scope,
                                          CallArgs &args) {
  FramePtr parent = scope.lock();
  if (parent == nullptr) {
    return absl::InvalidArgumentError(Cat("macro '", macro.name, "' called after its scope ended"));
  }
  if (call_depth_ >= limits_.max_call_depth) {
    return absl::ResourceExhaustedError(
        Cat("template: macro calls nested deeper than ", limits_.max_call_depth));
  }
  const std::vector<std::string> &params = macro.names;
  if (args.positional.size() > params.size()) {
    return absl::InvalidArgumentError(
        Cat("macro '", macro.name, "' takes at most ", params.size(), " arguments"));
  }
  auto frame = std::make_shared<Frame>();
  frame->parent = parent;
  std::vector<bool> bound(params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    frame->vars[params[i]] = args.positional[i];
    bound[i] = true;
  }
  for (auto &[key, value] : args.keyword) {
    auto it = std::find(params.begin(), params.end(), key);
    if (it == params.end()) {
      return absl::InvalidArgumentError(
          Cat("macro '", macro.name, "' takes no keyword argument '", key, "'"));
    }
    frame->vars[key] = value;
    bound[it - params.begin()] = true;
  }
  const size_t num_defaults = macro.children.size() - 1;
  const size_t first_default = params.size() - num_defaults;
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) continue;
    if (i >= first_default) {
      MODSERVE_ASSIGN_OR_RETURN(Value d, Eval(*macro.children[1 + i - first_default], frame));
      frame->vars[params[i]] = std::move(d);
    } else {
      frame->vars[params[i]] = Value::Undefined(params[i]);
    }
  }
  ++call_depth_;
  std::string out;
  const absl::Status s = Exec(*macro.children[0], frame, &out);
  --call_depth_;
  MODSERVE_RETURN_IF_ERROR(s);
  return Value::String(std::move(out));
}

absl::Status Renderer::Exec(const Node &n, const FramePtr &f, std::string *out) {
  MODSERVE_RETURN_IF_ERROR(Step());
  switch (n.kind) {
    case NodeKind::kBody:
      for (const NodePtr &c : n.children) {
        MODSERVE_RETURN_IF_ERROR(Exec(*c, f, out));
        if (flow_ != Flow::kNormal) break;
      }
      return absl::OkStatus();
    case NodeKind::kText:
      return Append(out, n.name);
    case NodeKind::kOutput: {
      MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*n.children[0], f));
      return Append(out, Str(v));
    }
    case NodeKind::kIf: {
      const size_t num_branches = (n.children.size() - (n.has_else ? 1 : 0)) / 2;
      for (size_t b = 0; b < num_branches; ++b) {
        MODSERVE_ASSIGN_OR_RETURN(Value test, Eval(*n.children[2 * b], f));
        if (test.Truthy()) return Exec(*n.children[2 * b + 1], f, out);
      }
      if (n.has_else) return Exec(*n.children.back(), f, out);
      return absl::OkStatus();
    }
    case NodeKind::kFor:
      return ExecFor(n, f, out);
    case NodeKind::kSet: {
      MODSERVE_ASSIGN_OR_RETURN(Value v, Eval(*n.children[1], f));
      return Assign(*n.children[0], v, f);
    }
    case NodeKind::kSetBlock: {
      std::string captured;
      MODSERVE_RETURN_IF_ERROR(Exec(*n.children[0], f, &captured));
      f->vars[n.name] = Value::String(std::move(captured));
      return absl::OkStatus();
    }
    case NodeKind::kMacro: {
      const Node *macro = &n;
      std::weak_ptr<Frame> scope = f;
      f->vars[n.name] = Value::Callable(n.name, [macro, scope](Renderer &r, CallArgs &args) {
        return r.CallMacro(*macro, scope, args);
      });
      return absl::OkStatus();
    }
    case NodeKind::kBreak:
      flow_ = Flow::kBreak;
      return absl::OkStatus();
    case NodeKind::kContinue:
      flow_ = Flow::kContinue;
      return absl::OkStatus();
    default:
      return AtLine(n, absl::InternalError("an expression executed as a statement"));
  }
}

// ---------------------------------------------------------------------------------------------
// Methods of str and dict (what templates call: "x".strip(), d.items(), d.get(k, default)).

absl::StatusOr<Value> Renderer::Method(const Value &self, const std::string &name, CallArgs &args) {
  if (self.kind() == Value::Kind::kDict) {
    const Dict &d = self.as_dict();
    if (name == "items" || name == "keys" || name == "values") {
      MODSERVE_RETURN_IF_ERROR(Bind(name, args, {}).status());
      std::vector<Value> out;
      for (const auto &[key, value] : d.items()) {
        if (name == "items") {
          out.push_back(MakeTuple2(Value::String(key), value));
        } else {
          out.push_back(name == "keys" ? Value::String(key) : value);
        }
      }
      return Value::List(std::move(out));
    }
    // get
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind("get", args, {"key", "default"}, 1));
    const Value *v = a[0]->is_string() ? d.Find(a[0]->as_string()) : nullptr;
    if (v != nullptr) return *v;
    return a[1] ? *a[1] : Value::None();
  }
  const std::string &s = self.as_string();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(name, args, {"chars"}));
    MODSERVE_ASSIGN_OR_RETURN(std::optional<std::string> chars, OptStrArg(name, a[0]));
    return Value::String(PythonStrip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(name, args, {"sep", "maxsplit"}));
    MODSERVE_ASSIGN_OR_RETURN(std::optional<std::string> sep, OptStrArg(name, a[0]));
    if (sep && sep->empty()) return absl::InvalidArgumentError("split(): empty separator");
    int64_t maxsplit = -1;
    if (a[1]) {
      MODSERVE_ASSIGN_OR_RETURN(maxsplit, IntArg(name, *a[1]));
    }
    std::vector<Value> out;
    for (std::string &part : PythonSplit(s, sep, maxsplit)) out.push_back(Value::String(part));
    return Value::List(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(name, args, {"prefix"}, 1));
    std::vector<Value> options =
        a[0]->kind() == Value::Kind::kTuple ? a[0]->as_list() : std::vector<Value>{*a[0]};
    for (const Value &o : options) {
      MODSERVE_ASSIGN_OR_RETURN(std::string x, StrArg(name, o));
      if (name == "startswith" ? absl::StartsWith(s, x) : absl::EndsWith(s, x)) {
        return Value::Bool(true);
      }
    }
    return Value::Bool(false);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "islower" || name == "isupper") {
    MODSERVE_RETURN_IF_ERROR(Bind(name, args, {}).status());
    if (name == "upper") return Value::String(PythonUpper(s));
    if (name == "lower") return Value::String(PythonLower(s));
    if (name == "title") return Value::String(PythonTitle(s));
    if (name == "capitalize") return Value::String(PythonCapitalize(s));
    if (name == "islower") return Value::Bool(PythonIsLower(s));
    if (name == "isupper") return Value::Bool(PythonIsUpper(s));
    const std::vector<char32_t> cps = DecodeUtf8(s);
    auto all = [&](auto pred) { return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred); };
    if (name == "isdigit") return Value::Bool(all(IsDigitCodePoint));
    if (name == "isalpha") return Value::Bool(all(IsAlphaCodePoint));
    if (name == "isspace") return Value::Bool(all(IsPythonSpace));
    return Value::Bool(all([](char32_t c) { return IsAlphaCodePoint(c) || IsDigitCodePoint(c); }));
  }
  if (name == "replace") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(name, args, {"old", "new", "count"}, 2));
    MODSERVE_ASSIGN_OR_RETURN(std::string from, StrArg(name, *a[0]));
    MODSERVE_ASSIGN_OR_RETURN(std::string to, StrArg(name, *a[1]));
    int64_t count = -1;
    if (a[2]) {
      MODSERVE_ASSIGN_OR_RETURN(count, IntArg(name, *a[2]));
    }
    CallArgs replace_args;
    replace_args.positional = {Value::String(from), Value::String(to), Value::Int(count)};
    return ApplyFilter(nullptr, "replace", self, replace_args);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(name, args, {"sub"}, 1));
    MODSERVE_ASSIGN_OR_RETURN(std::string sub, StrArg(name, *a[0]));
    if (name == "count") {
      if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) {
        ++n;
      }
      return Value::Int(n);
    }
    const size_t at = name == "find" || name == "index" ? s.find(sub) : s.rfind(sub);
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") {
        return absl::InvalidArgumentError("substring not found");
      }
      return Value::Int(-1);
    }
    return Value::Int(static_cast<int64_t>(CodePointCount(std::string_view(s).substr(0, at))));
  }
  if (name == "join") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(name, args, {"iterable"}, 1));
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return absl::InvalidArgumentError(
            Cat("sequence item ", i, ": expected str instance, ", TypeName(items[i]), " found"));
      }
      if (i > 0) out += s;
      out += items[i].as_string();
      MODSERVE_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  return absl::InvalidArgumentError(Cat("str has no method '", name, "'"));
}

// ---------------------------------------------------------------------------------------------
// Tests (`x is name(args)`)

absl::StatusOr<bool> Renderer::ApplyTest(std::string_view name, const Value &v, CallArgs &args) {
  using K = Value::Kind;
  auto no_args = [&]() { return Bind(name, args, {}).status(); };
  auto one_arg = [&]() -> absl::StatusOr<Value> {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(name, args, {"other"}, 1));
    return *a[0];
  };
  if (name == "defined" || name == "undefined") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.is_undefined() == (name == "undefined");
  }
  if (name == "none") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.is_none();
  }
  if (name == "boolean") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.kind() == K::kBool;
  }
  if (name == "true" || name == "false") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.kind() == K::kBool && v.as_bool() == (name == "true");
  }
  if (name == "integer") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.kind() == K::kInt;
  }
  if (name == "float") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.kind() == K::kFloat;
  }
  if (name == "number") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.is_number();
  }
  if (name == "string") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.is_string();
  }
  if (name == "mapping") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.kind() == K::kDict;
  }
  if (name == "sequence") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.is_string() || v.is_sequence() || v.kind() == K::kDict;
  }
  if (name == "iterable") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.kind() == K::kDict;
  }
  if (name == "callable") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return v.kind() == K::kFunction;
  }
  if (name == "odd" || name == "even") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    MODSERVE_ASSIGN_OR_RETURN(Value m, Arith("%", v, Value::Int(2)));
    return (m.as_float() != 0.0) == (name == "odd");
  }
  if (name == "divisibleby") {
    MODSERVE_ASSIGN_OR_RETURN(Value d, one_arg());
    MODSERVE_ASSIGN_OR_RETURN(Value m, Arith("%", v, d));
    return m.as_float() == 0.0;
  }
  if (name == "lower" || name == "upper") {
    MODSERVE_RETURN_IF_ERROR(no_args());
    return name == "lower" ? PythonIsLower(Str(v)) : PythonIsUpper(Str(v));
  }
  if (name == "sameas") {
    MODSERVE_ASSIGN_OR_RETURN(Value o, one_arg());
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.kind() == K::kBool || v.kind() == K::kInt || v.kind() == K::kFloat) return Equals(v, o);
    return v.identity() == o.identity();
  }
  if (name == "in") {
    MODSERVE_ASSIGN_OR_RETURN(Value seq, one_arg());
    return Contains(seq, v);
  }
  if (name == "==" || name == "eq" || name == "equalto") {
    MODSERVE_ASSIGN_OR_RETURN(Value o, one_arg());
    return Equals(v, o);
  }
  if (name == "!=" || name == "ne") {
    MODSERVE_ASSIGN_OR_RETURN(Value o, one_arg());
    return !Equals(v, o);
  }
  for (auto [test, op] : {std::pair<std::string_view, std::string_view>{"lt", "<"},
                          {"lessthan", "<"},
                          {"<", "<"},
                          {"le", "<="},
                          {"<=", "<="},
                          {"gt", ">"},
                          {"greaterthan", ">"},
                          {">", ">"},
                          {"ge", ">="},
                          {">=", ">="}}) {
    if (name != test) continue;
    MODSERVE_ASSIGN_OR_RETURN(Value o, one_arg());
    MODSERVE_ASSIGN_OR_RETURN(int c, Order(v, o, op));
    return op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
  }
  return absl::InvalidArgumentError(Cat("no test named '", name, "'"));
}

// ---------------------------------------------------------------------------------------------
// Filters (`x | name(args)`)

namespace {

// jinja2's make_attrgetter: "a.b.0" looks each part up as an item (digits as an index).
absl::StatusOr<Value> AttrPath(Renderer &r, const Value &item, const std::string &path) {
  Value v = item;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    int64_t index = 0;
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return c >= '0' && c <= '9';
    }) && std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
    MODSERVE_ASSIGN_OR_RETURN(
        v, r.GetItem(v, numeric ? Value::Int(index) : Value::String(std::string(part))));
  }
  return v;
}

// The sort key of filters with case_sensitive=False: strings compare lower-cased.
Value SortKey(const Value &v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(PythonLower(v.as_string()));
  return v;
}

absl::Status SortByKeys(std::vector<std::pair<Value, Value>> *keyed, bool reverse) {
  absl::Status error;
  std::stable_sort(keyed->begin(), keyed->end(), [&](const auto &a, const auto &b) {
    absl::StatusOr<int> c = Order(a.first, b.first, "<");
    if (!c.ok()) {
      if (error.ok()) error = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  return error;
}

}  // namespace

absl::StatusOr<Value> Renderer::ApplyFilter(const Node *at, std::string_view name, const Value &v,
                                            CallArgs &args) {
  (void)at;
  using K = Value::Kind;
  const std::string fname(name);
  if (name == "trim") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"chars"}));
    MODSERVE_ASSIGN_OR_RETURN(std::optional<std::string> chars, OptStrArg(fname, a[0]));
    return Value::String(PythonStrip(Str(v), chars, true, true));
  }
  if (name == "length" || name == "count") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    MODSERVE_ASSIGN_OR_RETURN(int64_t n, Length(v));
    return Value::Int(n);
  }
  if (name == "tojson") {
    MODSERVE_ASSIGN_OR_RETURN(
        auto a, Bind(fname, args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
    int indent = -1;
    if (a[1] && !a[1]->is_none()) {
      MODSERVE_ASSIGN_OR_RETURN(int64_t i, IntArg("tojson indent", *a[1]));
      indent = static_cast<int>(std::clamp<int64_t>(i, 0, 64));
    }
    std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
    if (a[2] && !a[2]->is_none()) {
      if (!a[2]->is_sequence() || a[2]->as_list().size() != 2 || !a[2]->as_list()[0].is_string() ||
          !a[2]->as_list()[1].is_string()) {
        return absl::InvalidArgumentError("tojson separators: expected two strings");
      }
      item_sep = a[2]->as_list()[0].as_string();
      key_sep = a[2]->as_list()[1].as_string();
    }
    MODSERVE_ASSIGN_OR_RETURN(std::string json,
                              ToJson(v, indent, a[3] && a[3]->Truthy(), item_sep, key_sep));
    if (a[0] && a[0]->Truthy()) {
      // ensure_ascii: \uXXXX escapes (surrogate pairs above U+FFFF), as Python writes them.
      std::string ascii;
      for (char32_t c : DecodeUtf8(json)) {
        auto esc = [&](uint32_t u) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", u);
          ascii += buf;
        };
        if (c < 0x80) {
          ascii.push_back(static_cast<char>(c));
        } else if (c < 0x10000) {
          esc(c);
        } else {
          esc(0xd800 + ((c - 0x10000) >> 10));
          esc(0xdc00 + ((c - 0x10000) & 0x3ff));
        }
      }
      json = std::move(ascii);
    }
    MODSERVE_RETURN_IF_ERROR(CheckSize(json.size()));
    return Value::String(std::move(json));
  }
  if (name == "string") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    return v.is_string() ? v : Value::String(Str(v));
  }
  if (name == "safe") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    return v;
  }
  if (name == "int") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"default", "base"}));
    const Value fallback = a[0] ? *a[0] : Value::Int(0);
    int64_t base = 10;
    if (a[1]) {
      MODSERVE_ASSIGN_OR_RETURN(base, IntArg("int base", *a[1]));
    }
    if (v.is_string()) {
      if (std::optional<int64_t> i = ParsePythonInt(v.as_string(), static_cast<int>(base))) {
        return Value::Int(*i);
      }
      if (std::optional<double> d = ParsePythonFloat(v.as_string());
          d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(*d));
      }
      return fallback;
    }
    if (v.kind() == K::kFloat) {
      if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) >= 9.2e18) return fallback;
      return Value::Int(static_cast<int64_t>(v.as_float()));
    }
    if (v.kind() == K::kInt || v.kind() == K::kBool) return Value::Int(v.as_int());
    return fallback;
  }
  if (name == "float") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"default"}));
    const Value fallback = a[0] ? *a[0] : Value::Float(0.0);
    if (v.is_number()) return Value::Float(v.as_float());
    if (v.is_string()) {
      if (std::optional<double> d = ParsePythonFloat(v.as_string())) return Value::Float(*d);
    }
    return fallback;
  }
  if (name == "abs") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    if (v.kind() == K::kFloat) return Value::Float(std::fabs(v.as_float()));
    if (v.is_number()) {
      if (v.as_int() == INT64_MIN) return absl::InvalidArgumentError("integer overflow");
      return Value::Int(std::llabs(v.as_int()));
    }
    return absl::InvalidArgumentError(Cat("bad operand type for abs(): '", TypeName(v), "'"));
  }
  if (name == "round") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"precision", "method"}));
    int64_t precision = 0;
    if (a[0]) {
      MODSERVE_ASSIGN_OR_RETURN(precision, IntArg("round precision", *a[0]));
    }
    std::string method = "common";
    if (a[1]) {
      MODSERVE_ASSIGN_OR_RETURN(method, StrArg("round method", *a[1]));
    }
    if (!v.is_number()) {
      return absl::InvalidArgumentError(Cat("round: '", TypeName(v), "' is not a number"));
    }
    if (method == "common") {
      if (v.kind() != K::kFloat) return Value::Int(v.as_int());  // round(int, n) stays an int
      return Value::Float(RoundHalfEven(v.as_float(), precision));
    }
    if (method != "ceil" && method != "floor") {
      return absl::InvalidArgumentError("round: method must be common, ceil or floor");
    }
    const double p = std::pow(10.0, static_cast<double>(precision));
    const double x = v.as_float() * p;
    return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
  }
  if (name == "lower" || name == "upper" || name == "capitalize" || name == "title") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    const std::string s = Str(v);
    if (name == "lower") return Value::String(PythonLower(s));
    if (name == "upper") return Value::String(PythonUpper(s));
    if (name == "capitalize") return Value::String(PythonCapitalize(s));
    // jinja2's title: split before runs of '-', whitespace and opening brackets; each piece gets
    // its first character upper-cased and the rest lower-cased.
    std::string out;
    bool word_start = true;
    for (char32_t c : DecodeUtf8(s)) {
      const bool boundary =
          IsPythonSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
      std::string one;
      AppendCodePoint(c, &one);
      if (boundary) {
        out += one;
        word_start = true;
      } else {
        out += word_start ? PythonUpper(one) : PythonLower(one);
        word_start = false;
      }
    }
    return Value::String(std::move(out));
  }
  if (name == "join") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"d", "attribute"}));
    std::string sep;
    if (a[0]) {
      MODSERVE_ASSIGN_OR_RETURN(sep, StrArg("join", *a[0]));
    }
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      Value item = items[i];
      if (a[1]) {
        MODSERVE_ASSIGN_OR_RETURN(item, AttrPath(*this, item, Str(*a[1])));
      }
      if (i > 0) out += sep;
      out += Str(item);
      MODSERVE_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "first" || name == "last") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (items.empty()) return Value::Undefined();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "reverse") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    if (v.is_string()) {
      std::vector<char32_t> cps = DecodeUtf8(v.as_string());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) AppendCodePoint(*it, &out);
      return Value::String(std::move(out));
    }
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    const bool sort = name == "sort";
    auto a_or = sort ? Bind(fname, args, {"reverse", "case_sensitive", "attribute"})
                     : Bind(fname, args, {"case_sensitive", "attribute"});
    MODSERVE_ASSIGN_OR_RETURN(auto a, std::move(a_or));
    const bool reverse = sort && a[0] && a[0]->Truthy();
    const std::optional<Value> &cs = a[sort ? 1 : 0];
    const std::optional<Value> &attr = a[sort ? 2 : 1];
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::vector<std::pair<Value, Value>> keyed;
    for (Value &item : items) {
      Value key = item;
      if (attr) {
        MODSERVE_ASSIGN_OR_RETURN(key, AttrPath(*this, item, Str(*attr)));
      }
      keyed.emplace_back(SortKey(key, cs && cs->Truthy()), std::move(item));
    }
    if (name == "unique") {
      std::vector<Value> out;
      std::vector<Value> seen;
      for (auto &entry : keyed) {
        // A named reference, not a structured binding: clang 14 cannot capture those.
        const Value &key = entry.first;
        if (std::any_of(seen.begin(), seen.end(), [&](const Value &s) { return Equals(s, key); })) {
          continue;
        }
        seen.push_back(key);
        out.push_back(entry.second);
      }
      return Value::List(std::move(out));
    }
    MODSERVE_RETURN_IF_ERROR(SortByKeys(&keyed, reverse));
    if (name == "min" || name == "max") {
      if (keyed.empty()) return Value::Undefined();
      // Python's min/max return the first of equal extremes.
      const std::pair<Value, Value> *best = &keyed.front();
      for (const auto &k : keyed) {
        MODSERVE_ASSIGN_OR_RETURN(int c, Order(k.first, best->first, "<"));
        if (name == "min" ? c < 0 : c > 0) best = &k;
      }
      return best->second;
    }
    std::vector<Value> out;
    for (auto &[key, item] : keyed) out.push_back(std::move(item));
    return Value::List(std::move(out));
  }
  if (name == "sum") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"attribute", "start"}));
    Value total = a[1] ? *a[1] : Value::Int(0);
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    for (Value &item : items) {
      if (a[0]) {
        MODSERVE_ASSIGN_OR_RETURN(item, AttrPath(*this, item, Str(*a[0])));
      }
      MODSERVE_ASSIGN_OR_RETURN(total, Arith("+", total, item));
    }
    return total;
  }
  if (name == "default" || name == "d") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"default_value", "boolean"}));
    const bool boolean = a[1] && a[1]->Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) {
      return a[0] ? *a[0] : Value::String("");
    }
    return v;
  }
  if (name == "items" || name == "dictsort") {
    auto a_or = name == "items" ? Bind(fname, args, {})
                                : Bind(fname, args, {"case_sensitive", "by", "reverse"});
    MODSERVE_ASSIGN_OR_RETURN(auto a, std::move(a_or));
    if (v.is_undefined()) return Value::List({});
    if (v.kind() != K::kDict) {
      return absl::InvalidArgumentError("can only get item pairs from a mapping");
    }
    std::vector<std::pair<Value, Value>> keyed;
    const bool by_value = name == "dictsort" && a[1] && Str(*a[1]) == "value";
    const bool case_sensitive = name == "dictsort" && a[0] && a[0]->Truthy();
    for (const auto &[key, item] : v.as_dict().items()) {
      keyed.emplace_back(SortKey(by_value ? item : Value::String(key), case_sensitive),
                         MakeTuple2(Value::String(key), item));
    }
    if (name == "dictsort") {
      MODSERVE_RETURN_IF_ERROR(SortByKeys(&keyed, a[2] && a[2]->Truthy()));
    }
    std::vector<Value> out;
    for (auto &[key, item] : keyed) out.push_back(std::move(item));
    return Value::List(std::move(out));
  }
  if (name == "map") {
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::optional<std::string> attribute;
    std::optional<Value> fallback;
    for (auto &[key, value] : args.keyword) {
      if (key == "attribute") {
        attribute = Str(value);
      } else if (key == "default") {
        fallback = value;
      } else if (args.positional.empty()) {
        return absl::InvalidArgumentError(Cat("map: unexpected argument '", key, "'"));
      }
    }
    std::vector<Value> out;
    if (attribute) {
      for (const Value &item : items) {
        MODSERVE_ASSIGN_OR_RETURN(Value x, AttrPath(*this, item, *attribute));
        if (x.is_undefined() && fallback) x = *fallback;
        out.push_back(std::move(x));
      }
      return Value::List(std::move(out));
    }
    if (args.positional.empty())
      return absl::InvalidArgumentError("map: give a filter or attribute=");
    MODSERVE_ASSIGN_OR_RETURN(std::string filter, StrArg("map", args.positional[0]));
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value &item : items) {
      CallArgs copy = rest;
      MODSERVE_ASSIGN_OR_RETURN(Value x, ApplyFilter(at, filter, item, copy));
      out.push_back(std::move(x));
    }
    return Value::List(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_when = name == "select" || name == "selectattr";
    MODSERVE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    size_t next = 0;
    std::string attribute;
    if (by_attr) {
      if (args.positional.empty()) {
        return absl::InvalidArgumentError(Cat(name, ": missing the attribute"));
      }
      attribute = Str(args.positional[next++]);
    }
    std::optional<std::string> test;
    if (next < args.positional.size()) {
      MODSERVE_ASSIGN_OR_RETURN(test, StrArg(fname, args.positional[next++]));
    }
    CallArgs test_args;
    test_args.positional.assign(args.positional.begin() + next, args.positional.end());
    test_args.keyword = args.keyword;
    std::vector<Value> out;
    for (const Value &item : items) {
      Value subject = item;
      if (by_attr) {
        MODSERVE_ASSIGN_OR_RETURN(subject, AttrPath(*this, item, attribute));
      }
      bool pass;
      if (test) {
        CallArgs copy = test_args;
        MODSERVE_ASSIGN_OR_RETURN(pass, ApplyTest(*test, subject, copy));
      } else {
        pass = subject.Truthy();
      }
      if (pass == keep_when) out.push_back(item);
    }
    return Value::List(std::move(out));
  }
  if (name == "replace") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"old", "new", "count"}, 2));
    const std::string s = Str(v);
    MODSERVE_ASSIGN_OR_RETURN(std::string from, StrArg("replace", *a[0]));
    MODSERVE_ASSIGN_OR_RETURN(std::string to, StrArg("replace", *a[1]));
    int64_t count = -1;
    if (a[2] && !a[2]->is_none()) {
      MODSERVE_ASSIGN_OR_RETURN(count, IntArg("replace", *a[2]));
    }
    std::string out;
    if (from.empty()) {
      // Python inserts `new` before every character and at the end.
      const std::vector<char32_t> cps = DecodeUtf8(s);
      int64_t done = 0;
      for (char32_t c : cps) {
        if (count < 0 || done < count) {
          out += to;
          ++done;
        }
        AppendCodePoint(c, &out);
      }
      if (count < 0 || done < count) out += to;
    } else {
      size_t start = 0;
      int64_t done = 0;
      for (size_t hit = s.find(from); hit != std::string::npos && (count < 0 || done < count);
           hit = s.find(from, start)) {
        out.append(s, start, hit - start);
        out += to;
        start = hit + from.size();
        ++done;
        MODSERVE_RETURN_IF_ERROR(CheckSize(out.size()));
      }
      out.append(s, start, std::string::npos);
    }
    MODSERVE_RETURN_IF_ERROR(CheckSize(out.size()));
    return Value::String(std::move(out));
  }
  if (name == "indent") {
    MODSERVE_ASSIGN_OR_RETURN(auto a, Bind(fname, args, {"width", "first", "blank"}));
    std::string indention = "    ";
    if (a[0]) {
      if (a[0]->is_string()) {
        indention = a[0]->as_string();
      } else {
        MODSERVE_ASSIGN_OR_RETURN(int64_t w, IntArg("indent width", *a[0]));
        indention.assign(static_cast<size_t>(std::clamp<int64_t>(w, 0, 256)), ' ');
      }
    }
    const bool first = a[1] && a[1]->Truthy();
    const bool blank = a[2] && a[2]->Truthy();
    // jinja2 appends a newline, then splits lines (so a trailing newline is not indented).
    std::vector<std::string> lines;
    {
      const std::string s = Str(v) + "\n";
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          lines.push_back(s.substr(start, i - start));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          start = i + 1;
        }
      }
      if (start < s.size()) lines.push_back(s.substr(start));
    }
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n";
      if (i > 0 && (blank || !lines[i].empty())) out += indention;
      out += lines[i];
    }
    if (first) out = indention + out;
    MODSERVE_RETURN_IF_ERROR(CheckSize(out.size()));
    return Value::String(std::move(out));
  }
  if (name == "wordcount") {
    MODSERVE_RETURN_IF_ERROR(Bind(fname, args, {}).status());
    int64_t words = 0;
    bool in_word = false;
    for (char32_t c : DecodeUtf8(Str(v))) {
      const bool word = c == '_' || IsAlphaCodePoint(c) || IsDigitCodePoint(c);
      if (word && !in_word) ++words;
      in_word = word;
    }
    return Value::Int(words);
  }
  return absl::InvalidArgumentError(Cat("no filter named '", name, "'"));
}

// ---------------------------------------------------------------------------------------------
// Globals and the entry points

namespace {

void AddGlobals(Frame *globals) {
  globals->vars["range"] =
      Value::Callable("range", [](Renderer &, CallArgs &args) -> absl::StatusOr<Value> {
        MODSERVE_ASSIGN_OR_RETURN(auto a, Bind("range", args, {"start", "stop", "step"}, 1));
        int64_t start = 0, stop = 0, step = 1;
        if (a[1]) {
          MODSERVE_ASSIGN_OR_RETURN(start, IntArg("range", *a[0]));
          MODSERVE_ASSIGN_OR_RETURN(stop, IntArg("range", *a[1]));
        } else {
          MODSERVE_ASSIGN_OR_RETURN(stop, IntArg("range", *a[0]));
        }
        if (a[2]) {
          MODSERVE_ASSIGN_OR_RETURN(step, IntArg("range", *a[2]));
        }
        if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
        const double n = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                   static_cast<double>(step));
        if (n > kMaxRange) {
          return absl::InvalidArgumentError(
              Cat("range too big: the sandbox allows ", kMaxRange, " items"));
        }
        std::vector<Value> out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
          out.push_back(Value::Int(i));
        return Value::List(std::move(out));
      });
  globals->vars["namespace"] =
      Value::Callable("namespace", [](Renderer &, CallArgs &args) -> absl::StatusOr<Value> {
        Dict d;
        for (const Value &p : args.positional) {
          if (p.kind() != Value::Kind::kDict) {
            return absl::InvalidArgumentError("namespace(): positional arguments must be dicts");
          }
          for (const auto &[k, x] : p.as_dict().items()) d.Set(k, x);
        }
        for (const auto &[k, x] : args.keyword) d.Set(k, x);
        return Value::Namespace(std::move(d));
      });
  globals->vars["dict"] =
      Value::Callable("dict", [](Renderer &, CallArgs &args) -> absl::StatusOr<Value> {
        if (!args.positional.empty())
          return absl::InvalidArgumentError("dict(): keyword arguments only");
        Dict d;
        for (const auto &[k, x] : args.keyword) d.Set(k, x);
        return Value::FromDict(std::move(d));
      });
  globals->vars["raise_exception"] =
      Value::Callable("raise_exception", [](Renderer &, CallArgs &args) -> absl::StatusOr<Value> {
        std::string message = args.positional.empty() ? "" : Str(args.positional[0]);
        absl::Status s = absl::InvalidArgumentError(message);
        s.SetPayload(kRaisePayload, absl::Cord("1"));
        return s;
      });
  globals->vars["strftime_now"] =
      Value::Callable("strftime_now", [](Renderer &, CallArgs &args) -> absl::StatusOr<Value> {
        MODSERVE_ASSIGN_OR_RETURN(auto a, Bind("strftime_now", args, {"format"}, 1));
        MODSERVE_ASSIGN_OR_RETURN(std::string format, StrArg("strftime_now", *a[0]));
        const std::time_t now = std::time(nullptr);
        std::tm local;
        localtime_r(&now, &local);
        char buf[256];
        const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &local);
        // A conversion the C library does not know may cut a multi-byte character.
        return Value::String(engine::ReplaceInvalidUtf8(std::string_view(buf, n)));
      });
}

// jinja2's source handling: every newline becomes "\n" and one trailing newline is dropped
// (keep_trailing_newline=False).
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  if (!engine::IsValidUtf8(source)) {
    return absl::InvalidArgumentError(
        Cat("template: not valid UTF-8 at byte ", engine::FirstInvalidUtf8Offset(source)));
  }
  Lexer lexer(NormalizeNewlines(source));
  MODSERVE_ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.Run());
  Parser parser(std::move(tokens));
  Template t;
  MODSERVE_ASSIGN_OR_RETURN(t.root_, parser.ParseTemplate());
  return t;
}

absl::StatusOr<std::string> Template::Render(const Value &context,
                                             const RenderLimits &limits) const {
  auto globals = std::make_shared<Frame>();
  AddGlobals(globals.get());
  auto variables = std::make_shared<Frame>();
  variables->parent = globals;
  if (context.kind() == Value::Kind::kDict) {
    for (const auto &[key, value] : context.as_dict().items()) variables->vars[key] = value;
  } else if (!context.is_undefined() && !context.is_none()) {
    return absl::InvalidArgumentError("template context: expected a dict");
  }
  auto top = std::make_shared<Frame>();
  top->parent = variables;
  Renderer renderer(limits);
  std::string out;
  MODSERVE_RETURN_IF_ERROR(renderer.Exec(*root_, top, &out));
  return out;
}

bool IsRaisedByTemplate(const absl::Status &status) {
  return status.GetPayload(kRaisePayload).has_value();
}

}  // namespace modserve::server::jinja
