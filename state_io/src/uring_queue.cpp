// The io_uring queue (liburing): one ring, used by one thread at a time. A request the ring has
// no room for waits in a backlog; a short transfer is resubmitted for the rest.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "queues.h"
#include "transfer.h"

namespace zo::state_io::detail {
namespace {

class UringQueue final : public IoQueue {
 public:
  UringQueue(unsigned depth, CompletionHook hook)
      : depth_(std::max(depth, 1u)), hook_(std::move(hook)) {
    if (const int r = io_uring_queue_init(depth_, &ring_, 0); r < 0) {
      throw IoError(std::string("io_uring is not available here: ") + std::strerror(-r));
    }
  }
  ~UringQueue() override {
    // The kernel may still write into buffers of requests in flight: wait for them first.
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r == -EINTR) continue;
      if (r < 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
    io_uring_queue_exit(&ring_);
  }

  std::uint64_t submit(const IoRequest& r) override {
    r.file->check_transfer(r.offset, r.data, r.bytes);
    const std::lock_guard<std::mutex> lock(mu_);
    check_usable();
    reap_ready();  // before this request is queued: a failure here leaves it unqueued
    const std::uint64_t ticket = tickets_.add(r);
    backlog_.push_back(ticket);
    fill();
    return ticket;
  }

  std::chrono::steady_clock::time_point wait(std::uint64_t ticket) override {
    const std::lock_guard<std::mutex> lock(mu_);
    check_usable();
    reap_ready();
    return tickets_.finish(ticket, [&](const Transfer& t) {
      while (!t.complete)
        reap_one();
    });
  }

  std::string name() const override { return "io_uring"; }

 private:
  // Moves backlog entries into the ring while it has room, and submits them.
  void fill() {
    unsigned queued = 0;
    while (!backlog_.empty() && in_flight_ < depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      const std::uint64_t ticket = backlog_.front();
      backlog_.pop_front();
      const IoRequest p = tickets_.at(ticket).part();
      if (p.op == IoRequest::Op::kRead) {
        io_uring_prep_read(sqe, p.file->fd(), p.data, unsigned(p.bytes), p.offset);
      } else {
        io_uring_prep_write(sqe, p.file->fd(), p.data, unsigned(p.bytes), p.offset);
      }
      io_uring_sqe_set_data64(sqe, ticket);
      ++in_flight_;
      ++queued;
    }
    if (queued == 0) return;
    int r;
    do {
      r = io_uring_submit(&ring_);
    } while (r == -EINTR);
    if (r >= 0 && unsigned(r) == queued) return;
    // Requests the kernel did not take stay prepared in the ring and are never waited for (the
    // destructor waits only for what the kernel took); their tickets never complete, so the
    // queue refuses all further use.
    in_flight_ -= queued - unsigned(std::max(r, 0));
    failed_ = std::string("io_uring_submit failed: ") +
              (r < 0 ? std::strerror(-r)
                     : "took " + std::to_string(r) + " of " + std::to_string(queued) + " requests");
    throw IoError(failed_);
  }

  void check_usable() const {
    if (!failed_.empty()) throw IoError("the io_uring queue failed earlier (" + failed_ + ")");
  }

  // Takes one completion: the transfer advances, is resubmitted for its rest, or completes.
  void reap_one() {
    if (in_flight_ == 0) fill();
    io_uring_cqe* cqe = nullptr;
    int r;
    do {
      r = io_uring_wait_cqe(&ring_, &cqe);
    } while (r == -EINTR);
    if (r < 0) throw IoError(std::string("io_uring_wait_cqe failed: ") + std::strerror(-r));
    take(cqe);
  }

  // Takes the completions already there without waiting: a transfer's completion time is then
  // when the queue was next used after it, not when it was waited for.
  void reap_ready() {
    io_uring_cqe* cqe = nullptr;
    while (in_flight_ > 0 && io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr)
      take(cqe);
  }

  void take(io_uring_cqe* cqe) {
    const std::uint64_t ticket = io_uring_cqe_get_data64(cqe);
    const long result = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --in_flight_;
    Transfer& t = tickets_.at(ticket);
    if (!t.advance(result, hook_)) backlog_.push_front(ticket);
    fill();
  }

  const unsigned depth_;
  const CompletionHook hook_;
  io_uring ring_{};
  std::mutex mu_;
  Tickets tickets_;
  std::deque<std::uint64_t> backlog_;
  unsigned in_flight_ = 0;  // taken by the kernel, not yet reaped
  std::string failed_;      // why the ring cannot be used any more; empty while it can
};

}  // namespace

std::unique_ptr<IoQueue> make_uring_queue(unsigned depth, CompletionHook hook) {
  return std::make_unique<UringQueue>(depth, std::move(hook));
}

}  // namespace zo::state_io::detail
