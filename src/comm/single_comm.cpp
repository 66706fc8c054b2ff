#include <cstring>

#include "comm/comm.h"

namespace zo::comm {
namespace {

class SingleProcessComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string name() const override { return "single process"; }
  void all_reduce(double*, std::size_t, ReduceOp) override {}
  void all_reduce(float*, std::size_t, ReduceOp) override {}
  void reduce_scatter(const float* in, float* out, std::size_t count) override {
    if (in != out) std::memmove(out, in, count * sizeof(float));
  }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    if (in != out) std::memmove(out, in, bytes);
  }
  void broadcast(void*, std::size_t, int root) override {
    if (root != 0) throw std::invalid_argument("broadcast: root " + std::to_string(root) + " of 1");
  }
  void barrier() override {}
  std::unique_ptr<Communicator> duplicate() override {
    return std::make_unique<SingleProcessComm>();
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_comm() {
  return std::make_unique<SingleProcessComm>();
}

std::unique_ptr<Communicator> make_comm_from_env(double timeout_s) {
  const RankInfo info = rank_info_from_env();
  if (info.size == 1) return make_single_process_comm();
  return make_mpi_comm(timeout_s);
}

}  // namespace zo::comm
