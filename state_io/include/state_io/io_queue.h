// Asynchronous transfers between host memory and StateFiles: io_uring (liburing), or a pool of
// threads calling pread/pwrite where io_uring is unavailable (an old kernel, a seccomp profile
// that forbids it, io_uring_disabled). Both continue short transfers and report failures the same
// way, through one completion path a test can perturb.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "state_io/state_file.h"

namespace zo::state_io {

struct IoRequest {
  enum class Op : std::uint8_t { kRead, kWrite };
  Op op = Op::kRead;
  const StateFile* file = nullptr;
  std::uint64_t offset = 0;
  void* data = nullptr;  // valid until the request is waited for
  std::size_t bytes = 0;
};

// Sees the result of every system transfer a request makes (bytes moved, or -errno) and returns
// the result to act on: tests inject EIO, ENOSPC and short transfers into either queue with it.
using CompletionHook = std::function<long(const IoRequest& part, long result)>;

enum class QueueKind : std::uint8_t { kAuto, kUring, kThreads };

struct QueueOptions {
  QueueKind kind = QueueKind::kAuto;  // kAuto: io_uring, else threads
  unsigned depth = 16;                // io_uring entries; the thread pool queues without bound
  unsigned threads = 2;               // the thread pool's workers
  CompletionHook hook;                // tests only
};

class IoQueue {
 public:
  virtual ~IoQueue() = default;
  // Starts a transfer (checked by StateFile::check_transfer); returns its ticket.
  virtual std::uint64_t submit(const IoRequest& r) = 0;
  // Returns when the ticket's transfer is complete, with the time the queue saw it complete
  // (for traces); throws IoError if it failed. Each ticket is waited for once; tickets may be
  // waited for in any order.
  virtual std::chrono::steady_clock::time_point wait(std::uint64_t ticket) = 0;
  // "io_uring" or "threads".
  virtual std::string name() const = 0;
};

// kAuto: io_uring when the kernel allows it, else the thread pool, with the reason in *note (if
// given). kUring: io_uring or IoError. The queue is used by one thread at a time.
std::unique_ptr<IoQueue> make_io_queue(const QueueOptions& options = {},
                                       std::string* note = nullptr);

}  // namespace zo::state_io
