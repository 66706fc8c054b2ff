#include "state_io/io_queue.h"

#include "queues.h"

namespace zo::state_io {

std::unique_ptr<IoQueue> make_io_queue(const QueueOptions& o, std::string* note) {
  if (o.kind == QueueKind::kThreads) return detail::make_thread_queue(o.threads, o.hook);
  if (o.kind == QueueKind::kUring) return detail::make_uring_queue(o.depth, o.hook);
  try {
    return detail::make_uring_queue(o.depth, o.hook);
  } catch (const IoError& e) {
    if (note != nullptr) {
      *note = std::string(e.what()) + "; pread/pwrite on " + std::to_string(o.threads) +
              " threads instead";
    }
    return detail::make_thread_queue(o.threads, o.hook);
  }
}

}  // namespace zo::state_io
