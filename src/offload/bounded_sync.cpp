#include "offload/bounded_sync.h"

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "core/error.h"

namespace zo::offload {

BoundedSync::BoundedSync(dev::Device& device, int rank, int ranks, double timeout_s,
                         std::vector<comm::StreamComm*> comms)
    : dev_(device),
      rank_(rank),
      ranks_(ranks),
      timeout_s_(timeout_s),
      comms_(std::move(comms)),
      marker_(device.create_event()) {}

void BoundedSync::operator()(dev::Stream& s, const char* what) {
  if (ranks_ > 1) {
    using Clock = std::chrono::steady_clock;
    dev_.record(*marker_, s);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    for (int spins = 0; !marker_->query(); ++spins) {
      if (Clock::now() > deadline) {
        for (comm::StreamComm* c : comms_)
          c->abort();
        throw CommError("rank " + std::to_string(rank_) + " of " + std::to_string(ranks_) + ": " +
                        what + " did not complete within " + std::to_string(int(timeout_s_)) +
                        " s: another rank has died, stopped, or runs a different configuration "
                        "(--comm-timeout)");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  s.synchronize();  // rethrows a failed collective or copy
}

void finish_quietly(SerialQueue& worker, dev::Stream& stream) noexcept {
  try {
    worker.wait_idle();
  } catch (const std::exception&) {
  }
  dev::synchronize_quietly(stream);
}

}  // namespace zo::offload
