// Helpers shared by the fuzz targets: a contract check that aborts with its reason, and a strict
// UTF-8 validator written independently of engine/tokenizer/utf8.h so the targets can judge it.
// Not a test framework: a failed check ends the process, which is what libFuzzer records.
#ifndef MODSERVE_TESTS_FUZZ_FUZZ_UTIL_H_
#define MODSERVE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace modserve::fuzz {

[[noreturn]] inline void FailCheck(const char* file, int line, const char* cond,
                                   const std::string& detail) {
  std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", file, line, cond, detail.c_str());
  std::abort();
}

// FUZZ_CHECK(cond, detail): `detail` is any expression convertible to std::string, evaluated
// only on failure.
#define FUZZ_CHECK(cond, detail)                                                   \
  do {                                                                             \
    if (!(cond)) ::modserve::fuzz::FailCheck(__FILE__, __LINE__, #cond, (detail)); \
  } while (0)

// RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF.
inline bool IsStrictUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n;
    char32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(n) >= s.size()) return false;  // cut short
    for (int k = 1; k <= n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// At most `max` bytes of `s`, with non-printable bytes escaped, for failure messages.
inline std::string Escape(std::string_view s, size_t max = 200) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace modserve::fuzz

#endif  // MODSERVE_TESTS_FUZZ_FUZZ_UTIL_H_
