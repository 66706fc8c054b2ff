// One worker thread running tasks in FIFO order: each host-backend stream is one, and so are the
// offload engine's CPU Adam and gradient-accumulation threads.
//
// Errors are sticky, as on a CUDA stream: after a task throws, later tasks are skipped
// (destroyed unrun, which releases what they captured) until wait_idle() or rethrow_if_failed()
// reports the first error, once, on the caller's thread; then the queue runs tasks again. Tasks
// posted with always_run still run after an error (event markers), so whoever waits on them
// never hangs.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace zo {

class SerialQueue {
 public:
  explicit SerialQueue(std::string name);
  // Runs (or skips) what is queued and joins; never throws. An error nobody reported is printed
  // to stderr with the queue's name.
  ~SerialQueue();
  SerialQueue(const SerialQueue&) = delete;
  SerialQueue& operator=(const SerialQueue&) = delete;

  void post(std::function<void()> task, bool always_run = false);
  // Blocks until every posted task has run; rethrows the first error since the last report.
  void wait_idle();
  // Rethrows the first error since the last report without waiting.
  void rethrow_if_failed();

 private:
  struct Task {
    std::function<void()> fn;
    bool always_run = false;
  };
  void loop();

  std::string name_;
  std::mutex mu_;
  std::condition_variable work_, idle_;
  std::deque<Task> tasks_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace zo
