// One background thread that runs jobs in FIFO order: the engine's CPU Adam thread and its
// gradient-accumulation thread. A job that throws stops nothing else; the first error is kept
// and rethrown (once) by the next wait_idle() or rethrow_if_failed(), on the caller's thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace zo::offload {

class SerialWorker {
 public:
  explicit SerialWorker(std::string name);
  ~SerialWorker();  // finishes queued jobs, joins; never throws (a pending error is dropped)
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void post(std::function<void()> job);
  // Blocks until every posted job has run; rethrows the first error since the last report.
  void wait_idle();
  void rethrow_if_failed();

 private:
  void loop();

  std::string name_;
  std::mutex mu_;
  std::condition_variable work_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace zo::offload
