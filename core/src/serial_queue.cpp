#include "core/serial_queue.h"

#include <cstdio>
#include <utility>

namespace zo {

SerialQueue::SerialQueue(std::string name) : name_(std::move(name)), thread_([this] { loop(); }) {}

SerialQueue::~SerialQueue() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  try {
    if (thread_.joinable()) thread_.join();
  } catch (...) {  // join throws only for a thread that cannot be joined; nothing left to do
  }
  if (!error_) return;
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: %s destroyed with an unreported error: %s\n", name_.c_str(),
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "warning: %s destroyed with an unreported error\n", name_.c_str());
  }
}

void SerialQueue::post(std::function<void()> task, bool always_run) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(Task{std::move(task), always_run});
  }
  work_.notify_one();
}

void SerialQueue::wait_idle() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return tasks_.empty() && !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void SerialQueue::rethrow_if_failed() {
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void SerialQueue::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and everything ran
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    const bool skip = error_ != nullptr && !task.always_run;
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    if (!skip) {
      try {
        task.fn();
      } catch (...) {
        error = std::current_exception();
      }
    }
    task.fn = nullptr;  // release captured state before reporting the task finished
    lock.lock();
    if (error && !error_) error_ = error;
    busy_ = false;
    if (tasks_.empty()) idle_.notify_all();
  }
}

}  // namespace zo
