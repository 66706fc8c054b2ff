// One request's progress, shared by both queues: the part still to move, and what one system
// transfer's result (after the test hook) means for it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include "state_io/io_queue.h"

namespace zo::state_io::detail {

// Parts of at most 1 GiB: under pread's 2 GiB and io_uring's 32-bit lengths.
inline constexpr std::size_t kMaxPart = std::size_t{1} << 30;

struct Transfer {
  IoRequest request;
  std::size_t done = 0;
  bool complete = false;
  std::string error;                               // set with complete when it failed
  std::chrono::steady_clock::time_point finished;  // set with complete

  IoRequest part() const {
    IoRequest p = request;
    p.offset += done;
    p.data = static_cast<char*>(request.data) + done;
    p.bytes = std::min(request.bytes - done, kMaxPart);
    return p;
  }

  // result: bytes moved or -errno for part(). Sets complete (and error); false while more of the
  // request is left to move.
  bool advance(long result, const CompletionHook& hook) {
    const IoRequest p = part();
    if (hook) result = hook(p, result);
    const char* what = request.op == IoRequest::Op::kRead ? "read" : "write";
    if (result < 0) {
      error = request.file->failure(what, p.offset, p.bytes, int(-result));
    } else if (result == 0) {
      error = request.file->nothing_moved(what, p.offset, p.bytes);
    } else if (std::size_t(result) > p.bytes) {
      error = request.file->name() + ": a " + what + " reported more bytes than asked for";
    } else {
      done += std::size_t(result);
    }
    complete = !error.empty() || done == request.bytes;
    if (complete) finished = std::chrono::steady_clock::now();
    return complete;
  }
};

// Requests by ticket from submit until waited for; each queue keeps its own under its own lock.
// Map nodes stay put, so a Transfer& outlives other tickets' coming and going.
class Tickets {
 public:
  std::uint64_t add(const IoRequest& r) {
    const std::uint64_t ticket = next_++;
    map_[ticket].request = r;
    return ticket;
  }
  Transfer& at(std::uint64_t ticket) { return map_.at(ticket); }
  // Calls until_complete(transfer), which returns once the transfer is complete, then forgets
  // the ticket and throws its error if it failed; else returns when it completed.
  template <class Wait>
  std::chrono::steady_clock::time_point finish(std::uint64_t ticket, Wait&& until_complete) {
    const auto it = map_.find(ticket);
    if (it == map_.end()) throw std::logic_error("IoQueue::wait: unknown ticket");
    until_complete(it->second);
    const std::string error = std::move(it->second.error);
    const auto finished = it->second.finished;
    map_.erase(it);
    if (!error.empty()) throw IoError(error);
    return finished;
  }

 private:
  std::map<std::uint64_t, Transfer> map_;
  std::uint64_t next_ = 1;
};

}  // namespace zo::state_io::detail
