#include <cstdlib>
#include <string>

#include "comm/comm.h"

namespace zo::comm {
namespace {

// The integer in environment variable `name`, or -1 when unset.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20) {
    throw std::invalid_argument(std::string(name) + "='" + v +
                                "' is not a rank or size (a non-negative integer)");
  }
  return static_cast<int>(x);
}

}  // namespace

RankInfo rank_info_from_env() {
  RankInfo info;
  struct Names {
    const char *rank, *size, *local_rank, *local_size, *source;
  };
  for (const Names& n :
       {Names{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun"},
        Names{"ZO_RANK", "ZO_WORLD_SIZE", "ZO_LOCAL_RANK", "ZO_LOCAL_SIZE", "environment"}}) {
    const int rank = env_int(n.rank), size = env_int(n.size);
    if (rank < 0 && size < 0) continue;
    if (rank < 0 || size < 1 || rank >= size) {
      throw std::invalid_argument(std::string("need ") + n.rank + " in [0, " + n.size + ") and " +
                                  n.size + " >= 1 (got " + std::to_string(rank) + " of " +
                                  std::to_string(size) + "); set both, or neither");
    }
    info.rank = rank;
    info.size = size;
    const int lr = env_int(n.local_rank), ls = env_int(n.local_size);
    info.local_rank = lr >= 0 ? lr : 0;
    info.local_size = ls >= 1 ? ls : 1;
    if (info.local_rank >= info.local_size) {
      throw std::invalid_argument(std::string(n.local_rank) + " must be < " + n.local_size);
    }
    info.source = n.source;
    return info;
  }
  return info;
}

}  // namespace zo::comm
