// Helpers shared by the pinned_memory sources; not part of the public interface.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace zo::pinned::internal {

// "64.0 MiB": for messages, next to the exact byte count.
inline std::string human_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  auto value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", value, kUnits[unit]);
  return text;
}

}  // namespace zo::pinned::internal
