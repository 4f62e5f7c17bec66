// Python's text semantics as the Jinja interpreter needs them: repr() of floats and strings,
// json.dumps(ensure_ascii=False) string escaping, code-point indexing of UTF-8, Python's whitespace
// set (str.strip/split/isspace), and case mapping (full Unicode with ICU, ASCII without). Inputs
// are valid UTF-8 (the interpreter only ever holds valid strings).
#ifndef MODSERVE_SERVER_JINJA_TEXT_H_
#define MODSERVE_SERVER_JINJA_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modserve::server::jinja {

// repr(float): the shortest digits that round-trip, fixed notation for exponents in [-4, 16), else
// d.ddde+XX ("1e+20", "1e-07"); "inf", "-inf", "nan"; always a '.' or 'e' ("2.0").
std::string PythonFloatRepr(double f);
// repr(str): single quotes unless the text holds ' and no ", escapes for \ and control bytes.
std::string PythonStringRepr(std::string_view s);
// A JSON string literal as json.dumps(..., ensure_ascii=False) writes it.
void AppendJsonString(std::string_view s, std::string *out);

std::vector<char32_t> DecodeUtf8(std::string_view s);
void AppendCodePoint(char32_t c, std::string *out);
size_t CodePointCount(std::string_view s);

// str.isspace() of one code point (Unicode White_Space plus the ASCII separators Python counts).
bool IsPythonSpace(char32_t c);
// str.strip / lstrip / rstrip: of `chars` (code points) when given, else of Python whitespace.
std::string PythonStrip(std::string_view s, const std::optional<std::string> &chars, bool left,
                        bool right);
// str.split(sep, maxsplit): whitespace runs when `sep` is nullopt (no empty fields), else the exact
// separator (which must not be empty). maxsplit < 0 = no limit.
std::vector<std::string> PythonSplit(std::string_view s, const std::optional<std::string> &sep,
                                     int64_t maxsplit);

std::string PythonUpper(std::string_view s);
std::string PythonLower(std::string_view s);
// str.capitalize(): first character title-cased, the rest lower-cased.
std::string PythonCapitalize(std::string_view s);
// str.title().
std::string PythonTitle(std::string_view s);
// Whether the string has a cased character and all cased characters are lower (upper).
bool PythonIsLower(std::string_view s);
bool PythonIsUpper(std::string_view s);
bool IsAlphaCodePoint(char32_t c);
bool IsDigitCodePoint(char32_t c);

}  // namespace modserve::server::jinja

#endif  // MODSERVE_SERVER_JINJA_TEXT_H_
