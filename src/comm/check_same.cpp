#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace zo::comm {
namespace {

std::uint64_t fnv1a(const std::string& s) {  // a fingerprint of the fingerprint
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

// The part of s around position p (where two fingerprints first differ).
std::string around(const std::string& s, std::size_t p) {
  constexpr std::size_t kBefore = 40, kAfter = 80;
  const std::size_t b = p > kBefore ? p - kBefore : 0;
  return (b > 0 ? "..." : "") + s.substr(b, kBefore + kAfter) +
         (b + kBefore + kAfter < s.size() ? "..." : "");
}

}  // namespace

std::string broadcast_string(Communicator& c, const std::string& mine, int root) {
  std::uint64_t n = mine.size();
  c.broadcast(&n, sizeof n, root);
  std::string s = c.rank() == root ? mine : std::string(n, '\0');
  c.broadcast(s.data(), n, root);
  return s;
}

void check_same_on_all_ranks(Communicator& c, const std::string& what,
                             const std::string& fingerprint, const std::string& fix) {
  const std::uint64_t mine[2] = {fnv1a(fingerprint), fingerprint.size()};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(c.size()));
  c.all_gather(mine, all.data(), sizeof mine);
  for (int r = 1; r < c.size(); ++r) {
    const std::size_t k = 2 * static_cast<std::size_t>(r);
    if (all[k] == all[0] && all[k + 1] == all[1]) continue;
    const std::string first = broadcast_string(c, fingerprint, 0);
    const std::string other = broadcast_string(c, fingerprint, r);
    std::size_t p = 0;
    while (p < first.size() && p < other.size() && first[p] == other[p])
      ++p;
    throw std::invalid_argument("ranks disagree on " + what + ": rank 0 has " + around(first, p) +
                                " but rank " + std::to_string(r) + " has " + around(other, p) +
                                "; " + fix);
  }
}

}  // namespace zo::comm
