#include "core/error.h"

#include "core/bytes.h"

namespace zo {
namespace {

std::string oom_message(const std::string& what, std::size_t requested, std::size_t in_use,
                        std::size_t capacity) {
  std::string m = "out of device memory allocating " + what + ": requested " +
                  format_bytes(requested) + " (" + std::to_string(requested) + " bytes) with " +
                  format_bytes(in_use) + " in use";
  if (capacity != 0) {
    m += " of " + format_bytes(capacity) + " capacity (" +
         format_bytes(in_use < capacity ? capacity - in_use : 0) + " free)";
  } else {
    m += " (no capacity limit set: the host ran out of memory)";
  }
  return m + "; use a smaller --micro-batch, enable --recompute, or raise --device-memory";
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(const std::string& what, std::size_t requested,
                                   std::size_t in_use, std::size_t capacity)
    : std::runtime_error(oom_message(what, requested, in_use, capacity)),
      requested_(requested),
      in_use_(in_use),
      capacity_(capacity) {}

}  // namespace zo
