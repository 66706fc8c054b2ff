// One request's progress, shared by both queues: the part still to move, and what one system
// transfer's result (after the test hook) means for it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "state_io/io_queue.h"

namespace zo::state_io::detail {

// Parts of at most 1 GiB: under pread's 2 GiB and io_uring's 32-bit lengths.
inline constexpr std::size_t kMaxPart = std::size_t{1} << 30;

struct Transfer {
  IoRequest request;
  std::size_t done = 0;
  bool complete = false;
  std::string error;  // set with complete when it failed

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
    return complete;
  }
};

}  // namespace zo::state_io::detail
