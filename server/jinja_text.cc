// Python text helpers. Case mapping and character classes come from ICU when the build has it (the
// same Unicode data Python uses, give or take a Unicode version); without ICU they cover ASCII
// only, which is what chat templates apply them to in practice.
#include "server/jinja_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"

#ifdef MODSERVE_JINJA_HAS_ICU
#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#endif

namespace modserve::server::jinja {

std::string PythonFloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form: [-]d[.ddd]e(+|-)XX.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  if (ec != std::errc()) return "nan";
  std::string_view sci(buf, end - buf);
  const bool negative = sci.front() == '-';
  if (negative) sci.remove_prefix(1);
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exponent - 1), '0');
      out += digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits;
      out.append(static_cast<size_t>(exponent + 1 - static_cast<int>(digits.size())), '0');
      out += ".0";
    } else {
      out += digits.substr(0, exponent + 1);
      out += ".";
      out += digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
  char exp[16];
  std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

std::string PythonStringRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0)) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      AppendCodePoint(c, &out);
    }
  }
  out.push_back(quote);
  return out;
}

void AppendJsonString(std::string_view s, std::string *out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

std::vector<char32_t> DecodeUtf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    int n = b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
    if (i + n > s.size()) n = 1;  // never happens for valid input; keeps the loop bounded
    char32_t c = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
    for (int k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(c);
    i += n;
  }
  return out;
}

void AppendCodePoint(char32_t c, std::string *out) { engine::AppendUtf8(c, out); }

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (unsigned char b : s) n += (b & 0xc0) != 0x80;
  return n;
}

bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

std::string PythonStrip(std::string_view s, const std::optional<std::string> &chars, bool left,
                        bool right) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  std::vector<char32_t> set;
  if (chars) set = DecodeUtf8(*chars);
  auto strip = [&](char32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : IsPythonSpace(c);
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendCodePoint(cps[i], &out);
  return out;
}

std::vector<std::string> PythonSplit(std::string_view s, const std::optional<std::string> &sep,
                                     int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::vector<char32_t> cps = DecodeUtf8(s);
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
    if (i == cps.size()) break;
    std::string field;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      // The rest, trailing whitespace dropped, is the last field.
      size_t end = cps.size();
      while (end > i && IsPythonSpace(cps[end - 1])) --end;
      for (; i < end; ++i) AppendCodePoint(cps[i], &field);
      out.push_back(std::move(field));
      break;
    }
    while (i < cps.size() && !IsPythonSpace(cps[i])) AppendCodePoint(cps[i++], &field);
    out.push_back(std::move(field));
  }
  return out;
}

namespace {

#ifdef MODSERVE_JINJA_HAS_ICU
char32_t ToTitleCp(char32_t c) { return static_cast<char32_t>(u_totitle(static_cast<UChar32>(c))); }
char32_t ToLowerCp(char32_t c) { return static_cast<char32_t>(u_tolower(static_cast<UChar32>(c))); }
bool IsCased(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED) != 0; }
bool IsLowerCp(char32_t c) { return u_islower(static_cast<UChar32>(c)) != 0; }
bool IsUpperCp(char32_t c) {
  return u_isupper(static_cast<UChar32>(c)) != 0 || u_istitle(static_cast<UChar32>(c)) != 0;
}
std::string IcuCase(std::string_view s, bool upper) {
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (upper) {
    u.toUpper(icu::Locale::getRoot());
  } else {
    u.toLower(icu::Locale::getRoot());
  }
  std::string out;
  u.toUTF8String(out);
  return out;
}
#else
char32_t ToTitleCp(char32_t c) { return c < 0x80 ? absl::ascii_toupper(c) : c; }
char32_t ToLowerCp(char32_t c) { return c < 0x80 ? absl::ascii_tolower(c) : c; }
bool IsCased(char32_t c) { return c < 0x80 && absl::ascii_isalpha(c); }
bool IsLowerCp(char32_t c) { return c < 0x80 && absl::ascii_islower(c); }
bool IsUpperCp(char32_t c) { return c < 0x80 && absl::ascii_isupper(c); }
std::string IcuCase(std::string_view s, bool upper) {
  std::string out(s);
  for (char &c : out) c = upper ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
  return out;
}
#endif

}  // namespace

std::string PythonUpper(std::string_view s) { return IcuCase(s, true); }
std::string PythonLower(std::string_view s) { return IcuCase(s, false); }

std::string PythonCapitalize(std::string_view s) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    AppendCodePoint(i == 0 ? ToTitleCp(cps[i]) : ToLowerCp(cps[i]), &out);
  }
  return out;
}

std::string PythonTitle(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    AppendCodePoint(previous_cased ? ToLowerCp(c) : ToTitleCp(c), &out);
    previous_cased = IsCased(c);
  }
  return out;
}

bool PythonIsLower(std::string_view s) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (IsUpperCp(c)) return false;
    cased |= IsLowerCp(c);
  }
  return cased;
}

bool PythonIsUpper(std::string_view s) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (IsLowerCp(c)) return false;
    cased |= IsUpperCp(c);
  }
  return cased;
}

bool IsAlphaCodePoint(char32_t c) {
#ifdef MODSERVE_JINJA_HAS_ICU
  return u_isalpha(static_cast<UChar32>(c)) != 0;
#else
  return c < 0x80 && absl::ascii_isalpha(c);
#endif
}

bool IsDigitCodePoint(char32_t c) {
#ifdef MODSERVE_JINJA_HAS_ICU
  return u_isdigit(static_cast<UChar32>(c)) != 0;
#else
  return c >= '0' && c <= '9';
#endif
}

}  // namespace modserve::server::jinja
