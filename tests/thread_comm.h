// An in-process communicator for tests: R threads of one process act as R ranks, so the offload
// engine's data-parallel path runs (and ThreadSanitizer watches it) without MPI. Every
// collective deposits the rank's pointer, waits for all ranks, computes its result from the
// others' buffers, and waits again before anyone may reuse a buffer. Sums run in rank order.
#pragma once

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/comm.h"

namespace zo::test {

class ThreadCommHub {
 public:
  explicit ThreadCommHub(int ranks) : ranks_(ranks), in_(std::size_t(ranks)), dups_(ranks, 0) {}

  void barrier() {
    std::unique_lock lock(mu_);
    const std::uint64_t gen = gen_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }
  // Publishes rank r's buffer and waits until every rank has; returns all of them.
  const std::vector<const void*>& exchange(int r, const void* p) {
    {
      std::lock_guard lock(mu_);
      in_[std::size_t(r)] = p;
    }
    barrier();
    return in_;
  }
  // The k-th duplicate (every rank asks for its k-th in the same order).
  std::shared_ptr<ThreadCommHub> duplicate(int r) {
    std::lock_guard lock(mu_);
    const std::size_t k = std::size_t(dups_[std::size_t(r)]++);
    if (children_.size() <= k) children_.push_back(std::make_shared<ThreadCommHub>(ranks_));
    return children_[k];
  }
  int ranks() const { return ranks_; }

 private:
  int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t gen_ = 0;
  std::vector<const void*> in_;
  std::vector<int> dups_;
  std::vector<std::shared_ptr<ThreadCommHub>> children_;
};

class ThreadComm final : public comm::Communicator {
 public:
  ThreadComm(std::shared_ptr<ThreadCommHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->ranks(); }
  int local_rank() const override { return rank_; }
  std::string name() const override { return "threads"; }

  void all_reduce(double* data, std::size_t n, comm::ReduceOp op) override { reduce(data, n, op); }
  void all_reduce(float* data, std::size_t n, comm::ReduceOp op) override { reduce(data, n, op); }
  void reduce_scatter(const float* in, float* out, std::size_t count) override {
    const auto& all = hub_->exchange(rank_, in);
    for (std::size_t i = 0; i < count; ++i) {
      float s = 0.0f;
      for (const void* p : all)
        s += static_cast<const float*>(p)[std::size_t(rank_) * count + i];
      out[i] = s;
    }
    hub_->barrier();
  }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    const auto& all = hub_->exchange(rank_, in);
    for (std::size_t r = 0; r < all.size(); ++r)
      std::memcpy(static_cast<char*>(out) + r * bytes, all[r], bytes);
    hub_->barrier();
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    const auto& all = hub_->exchange(rank_, data);
    if (rank_ != root) std::memcpy(data, all[std::size_t(root)], bytes);
    hub_->barrier();
  }
  void barrier() override { hub_->barrier(); }
  std::unique_ptr<comm::Communicator> duplicate() override {
    return std::make_unique<ThreadComm>(hub_->duplicate(rank_), rank_);
  }

 private:
  template <class T>
  void reduce(T* data, std::size_t n, comm::ReduceOp op) {
    const auto& all = hub_->exchange(rank_, data);
    std::vector<T> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      T v = static_cast<const T*>(all[0])[i];
      for (std::size_t r = 1; r < all.size(); ++r) {
        const T x = static_cast<const T*>(all[r])[i];
        v = op == comm::ReduceOp::kSum ? v + x : std::max(v, x);
      }
      out[i] = v;
    }
    hub_->barrier();  // everyone has read `data` before anyone overwrites it
    std::copy(out.begin(), out.end(), data);
  }

  std::shared_ptr<ThreadCommHub> hub_;
  int rank_;
};

}  // namespace zo::test
