#include "core/bytes.h"

#include <cmath>
#include <cstdio>
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

std::size_t parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
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
  if (pos == 0 || mult < 0 || !(x > 0) || !std::isfinite(x * mult)) {
    throw std::invalid_argument("cannot read size '" + text +
                                "': use a number with an optional unit B, KiB, MiB, GiB, TiB, "
                                "KB, MB, GB or TB (e.g. 512MiB)");
  }
  return static_cast<std::size_t>(x * mult);
}

}  // namespace zo
