#include "core/bytes.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>

namespace zo {

namespace {

// bytes in the largest unit of `units` (each `base` times the last) that is at most the value.
template <std::size_t N>
std::string format_in(std::size_t bytes, double base, const char* const (&units)[N]) {
  double v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (v >= base && u + 1 < N) {
    v /= base;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  return format_in(bytes, 1024.0, kUnits);
}

std::string format_bytes_si(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  return format_in(bytes, 1000.0, kUnits);
}

std::size_t parse_bytes(const std::string& text, std::string_view what) {
  const std::string named =
      (what.empty() ? std::string("size") : std::string(what)) + " '" + text + "'";
  auto refuse = [&named](const std::string& why) { throw std::invalid_argument(named + why); };
  static constexpr const char* kForms =
      "use a number with an optional unit B, KiB, MiB, GiB, TiB, KB, MB, GB or TB (e.g. 512MiB)";
  static constexpr const char* kRange =
      "a size is 1 byte to below 16 EiB (2^64 bytes), e.g. 512MiB";
  // The number: decimal digits, a point and an exponent only (strtod would also take leading
  // spaces, hexadecimal, "inf" and "nan").
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double x = text.empty() || std::strchr("0123456789.+-", text[0]) == nullptr
                       ? 0.0
                       : std::strtod(begin, &end);
  const bool underflow = errno == ERANGE && !(std::fabs(x) > 1);  // errno before anything else
  const std::size_t pos = end == nullptr ? 0 : static_cast<std::size_t>(end - begin);
  const bool decimal = pos > 0 && text.find_first_not_of("0123456789.eE+-") >= pos;
  const std::string unit = text.substr(pos);
  double mult = -1;
  if (unit.empty() || unit == "B") mult = 1;
  if (unit == "KiB") mult = 1024.0;
  if (unit == "MiB") mult = 1024.0 * 1024;
  if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  if (unit == "KB") mult = 1e3;
  if (unit == "MB") mult = 1e6;
  if (unit == "GB") mult = 1e9;
  if (unit == "TB") mult = 1e12;
  if (!decimal || mult < 0 || std::isnan(x)) refuse(" is not a size: " + std::string(kForms));
  if (!(x > 0)) {
    refuse((underflow ? " is less than one byte: " : " is not positive: ") + std::string(kRange));
  }
  // 2^64 is exact in a double; every double below it converts to a 64-bit count exactly (strtod's
  // overflow, HUGE_VAL, lands here too).
  constexpr double kLimit = 18446744073709551616.0;
  static_assert(sizeof(std::size_t) == 8, "sizes are 64-bit");
  const double bytes = x * mult;
  if (!(bytes < kLimit)) refuse(" is too large: " + std::string(kRange));
  if (mult == 1 && bytes != std::floor(bytes)) {
    refuse(" is not a whole number of bytes: give a whole count, or a larger unit (e.g. 1.5KiB)");
  }
  const double rounded = std::round(bytes);  // below 2^53 exact; above, bytes is whole already
  if (rounded < 1) refuse(" is less than one byte: " + std::string(kRange));
  return static_cast<std::size_t>(rounded);
}

}  // namespace zo
