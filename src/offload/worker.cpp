#include "offload/worker.h"

#include <utility>

namespace zo::offload {

SerialWorker::SerialWorker(std::string name)
    : name_(std::move(name)), thread_([this] { loop(); }) {}

SerialWorker::~SerialWorker() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

void SerialWorker::post(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
  }
  work_.notify_one();
}

void SerialWorker::wait_idle() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return jobs_.empty() && !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void SerialWorker::rethrow_if_failed() {
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void SerialWorker::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and everything ran
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    busy_ = false;
    if (jobs_.empty()) idle_.notify_all();
  }
}

}  // namespace zo::offload
