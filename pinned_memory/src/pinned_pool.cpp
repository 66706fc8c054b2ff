#include "pinned_memory/pinned_pool.h"

#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zo::pinned {

struct PinnedPool::State {
  PinOptions options;
  mutable std::mutex mutex;
  std::map<std::size_t, std::vector<PinnedBuffer>> idle;  // by capacity; back() is reused first
  PoolStats stats;
  std::atomic<bool> warned{false};

  void account(const PinnedBuffer& buffer, bool add) {
    std::size_t& bytes = buffer.is_pinned() ? stats.bytes_pinned : stats.bytes_pageable;
    bytes = add ? bytes + buffer.size() : bytes - buffer.size();
    stats.buffers = add ? stats.buffers + 1 : stats.buffers - 1;
  }
};

// ---- Lease --------------------------------------------------------------------------------------

PinnedPool::Lease::Lease(std::shared_ptr<State> pool, PinnedBuffer buffer,
                         std::size_t size) noexcept
    : pool_(std::move(pool)), buffer_(std::move(buffer)), size_(size) {}

PinnedPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::move(other.pool_)),
      buffer_(std::move(other.buffer_)),
      size_(std::exchange(other.size_, 0)) {}

PinnedPool::Lease& PinnedPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::move(other.pool_);
    buffer_ = std::move(other.buffer_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PinnedPool::Lease::reset() noexcept {
  if (!pool_) return;
  const std::shared_ptr<State> pool = std::move(pool_);
  size_ = 0;
  try {
    const std::lock_guard<std::mutex> lock(pool->mutex);
    pool->stats.bytes_leased -= buffer_.size();
    std::vector<PinnedBuffer>& list = pool->idle[buffer_.size()];
    list.push_back(std::move(buffer_));
  } catch (...) {
    // Out of memory growing the free list (or a failed lock): drop the buffer instead.
    if (!buffer_.empty()) {
      try {
        const std::lock_guard<std::mutex> lock(pool->mutex);
        pool->account(buffer_, false);
      } catch (...) {
      }
      buffer_ = PinnedBuffer{};
    }
  }
}

void PinnedPool::Lease::check_element_size(std::size_t element_bytes) const {
  if (size_ % element_bytes != 0) {
    throw std::logic_error("PinnedPool::Lease::span: " + std::to_string(size_) +
                           " bytes is not a whole number of " + std::to_string(element_bytes) +
                           "-byte elements");
  }
}

// ---- PinnedPool ---------------------------------------------------------------------------------

PinnedPool::PinnedPool(const PinOptions& options, std::size_t granularity)
    : state_(std::make_shared<State>()), granularity_(granularity) {
  if (granularity == 0) {
    throw std::invalid_argument(
        "PinnedPool: granularity must be > 0 bytes (the default is 2 MiB, one huge page)");
  }
  state_->options = options;
  state_->options.warn = false;
}

PinnedPool::~PinnedPool() = default;
PinnedPool::PinnedPool(PinnedPool&&) noexcept = default;
PinnedPool& PinnedPool::operator=(PinnedPool&&) noexcept = default;

std::size_t PinnedPool::size_class(std::size_t bytes) const {
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  if (bytes > max - (granularity_ - 1)) {
    throw std::invalid_argument("PinnedPool: a request of " + std::to_string(bytes) +
                                " bytes overflows size_t when rounded up to a multiple of " +
                                std::to_string(granularity_));
  }
  return (bytes + granularity_ - 1) / granularity_ * granularity_;
}

PinnedPool::Lease PinnedPool::acquire(std::size_t bytes) {
  if (!state_) throw std::logic_error("PinnedPool::acquire on a moved-from pool");
  if (bytes == 0) {
    throw std::invalid_argument("PinnedPool::acquire: a request of 0 bytes (ask for at least 1)");
  }
  const std::size_t capacity = size_class(bytes);
  {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    const auto it = state_->idle.find(capacity);
    if (it != state_->idle.end() && !it->second.empty()) {
      PinnedBuffer buffer = std::move(it->second.back());
      it->second.pop_back();
      ++state_->stats.hits;
      state_->stats.bytes_leased += capacity;
      return Lease(state_, std::move(buffer), bytes);
    }
    ++state_->stats.misses;
  }

  // Mapping and page-locking take milliseconds per GiB: done without holding the lock.
  PinnedBuffer buffer(capacity, state_->options);
  if (!buffer.fallback_reason().empty() && !state_->warned.exchange(true)) {
    emit_warning("pinned memory pool: " + buffer.fallback_reason() +
                 ". Using pageable memory for this pool (later fallbacks are not reported): "
                 "host<->device copies through it are slower and do not overlap with compute.");
  }
  const std::lock_guard<std::mutex> lock(state_->mutex);
  state_->account(buffer, true);
  state_->stats.bytes_leased += capacity;
  return Lease(state_, std::move(buffer), bytes);
}

PoolStats PinnedPool::stats() const {
  if (!state_) return {};
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

std::size_t PinnedPool::trim() {
  if (!state_) return 0;
  std::map<std::size_t, std::vector<PinnedBuffer>> freed;
  std::size_t bytes = 0;
  {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    for (const auto& [capacity, list] : state_->idle) {
      for (const PinnedBuffer& buffer : list) {
        state_->account(buffer, false);
        bytes += capacity;
      }
    }
    freed.swap(state_->idle);
  }
  return bytes;  // `freed` unpins and unmaps here, outside the lock
}

}  // namespace zo::pinned
