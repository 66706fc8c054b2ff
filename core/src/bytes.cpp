#include "core/bytes.h"

#include <cmath>
#include <cstdio>
#include <iterator>
#include <stdexcept>

namespace zo {

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string format_bytes_si(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (v >= 1000.0 && u + 1 < std::size(kUnits)) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
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
