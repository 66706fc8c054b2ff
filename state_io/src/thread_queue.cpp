// The fallback queue: worker threads calling pread/pwrite.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "queues.h"
#include "transfer.h"

namespace zo::state_io::detail {
namespace {

class ThreadQueue final : public IoQueue {
 public:
  ThreadQueue(unsigned threads, CompletionHook hook) : hook_(std::move(hook)) {
    for (unsigned i = 0; i < std::max(threads, 1u); ++i)
      workers_.emplace_back([this] { work(); });
  }
  ~ThreadQueue() override {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_)
      t.join();
  }

  std::uint64_t submit(const IoRequest& r) override {
    r.file->check_transfer(r.offset, r.data, r.bytes);
    const std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t ticket = tickets_.add(r);
    pending_.push_back(ticket);
    wake_.notify_one();
    return ticket;
  }

  std::chrono::steady_clock::time_point wait(std::uint64_t ticket) override {
    std::unique_lock<std::mutex> lock(mu_);
    return tickets_.finish(
        ticket, [&](const Transfer& t) { done_.wait(lock, [&] { return t.complete; }); });
  }

  std::string name() const override { return "threads"; }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (stop_) return;  // what was queued and not started is never waited for
      const std::uint64_t ticket = pending_.front();
      pending_.pop_front();
      Transfer t = tickets_.at(ticket);  // moved unlocked, published under the lock
      lock.unlock();
      for (bool complete = false; !complete;) {
        const IoRequest p = t.part();
        const int fd = p.file->fd();
        const ssize_t r = p.op == IoRequest::Op::kRead
                              ? ::pread(fd, p.data, p.bytes, off_t(p.offset))
                              : ::pwrite(fd, p.data, p.bytes, off_t(p.offset));
        if (r < 0 && errno == EINTR) continue;
        complete = t.advance(r < 0 ? -long(errno) : long(r), hook_);
      }
      lock.lock();
      tickets_.at(ticket) = std::move(t);
      done_.notify_all();
    }
  }

  const CompletionHook hook_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  Tickets tickets_;
  std::deque<std::uint64_t> pending_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoQueue> make_thread_queue(unsigned threads, CompletionHook hook) {
  return std::make_unique<ThreadQueue>(threads, std::move(hook));
}

}  // namespace zo::state_io::detail
