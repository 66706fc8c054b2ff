// A pool of PinnedBuffers: page-locking costs a syscall and a fault per page, so buffers that
// are needed again and again (staging for copies, checkpoint I/O) are kept and reused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "pinned_memory/pinned_buffer.h"

namespace zo::pinned {

struct PoolStats {
  std::size_t bytes_pinned = 0;    // capacity of owned buffers (idle or leased) that are pinned
  std::size_t bytes_pageable = 0;  // ... that fell back to pageable memory (or pinning is off)
  std::size_t bytes_leased = 0;    // capacity currently handed out
  std::size_t buffers = 0;         // buffers owned, idle or leased
  std::uint64_t hits = 0;          // acquire() served from the free list
  std::uint64_t misses = 0;        // acquire() that allocated a new buffer
};

// Hands out buffers of at least the requested size, rounded up to a multiple of `granularity`
// (a size class); a returned buffer serves the next request of the same class (last returned,
// first reused). All members are thread-safe. Buffers are freed by trim() or when the pool and
// every lease are gone: a Lease keeps the pool's state alive, so it may outlive the pool.
class PinnedPool {
  struct State;

 public:
  static constexpr std::size_t kDefaultGranularity = std::size_t{2} << 20;  // one huge page

  // Throws std::invalid_argument if granularity == 0. New buffers are made with `options`
  // (options.warn is ignored: the pool warns once, on its first fallback).
  explicit PinnedPool(const PinOptions& options = {},
                      std::size_t granularity = kDefaultGranularity);
  ~PinnedPool();
  PinnedPool(PinnedPool&&) noexcept;
  PinnedPool& operator=(PinnedPool&&) noexcept;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // RAII: owns one buffer while alive and gives it back to the pool on destruction or reset().
  class Lease {
   public:
    Lease() noexcept = default;
    ~Lease() { reset(); }
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    void* data() noexcept { return buffer_.data(); }
    const void* data() const noexcept { return buffer_.data(); }
    std::size_t size() const noexcept { return size_; }               // bytes requested
    std::size_t capacity() const noexcept { return buffer_.size(); }  // the size class
    bool is_pinned() const noexcept { return buffer_.is_pinned(); }
    const PinnedBuffer& buffer() const noexcept { return buffer_; }
    explicit operator bool() const noexcept { return !buffer_.empty(); }

    // The requested bytes as size() / sizeof(T) elements (throws std::logic_error if size()
    // is not a multiple of sizeof(T)).
    template <class T>
    std::span<T> span() {
      check_element_size(sizeof(T));
      return {static_cast<T*>(buffer_.data()), size_ / sizeof(T)};
    }
    template <class T>
    std::span<const T> span() const {
      check_element_size(sizeof(T));
      return {static_cast<const T*>(buffer_.data()), size_ / sizeof(T)};
    }

    void reset() noexcept;  // returns the buffer now; the lease becomes empty

   private:
    friend class PinnedPool;
    Lease(std::shared_ptr<State> pool, PinnedBuffer buffer, std::size_t size) noexcept;
    void check_element_size(std::size_t element_bytes) const;

    std::shared_ptr<State> pool_;
    PinnedBuffer buffer_;
    std::size_t size_ = 0;
  };

  // A buffer of capacity size_class(bytes). Throws std::invalid_argument for bytes == 0, what
  // PinnedBuffer throws when a new buffer cannot be allocated, std::logic_error on a moved-from
  // pool. Allocation happens outside the pool's lock.
  Lease acquire(std::size_t bytes);

  // bytes rounded up to a multiple of the granularity; throws std::invalid_argument on overflow.
  std::size_t size_class(std::size_t bytes) const;
  std::size_t granularity() const noexcept { return granularity_; }

  PoolStats stats() const;

  // Frees every idle buffer; returns the bytes freed. Leased buffers are untouched.
  std::size_t trim();

 private:
  std::shared_ptr<State> state_;
  std::size_t granularity_;
};

}  // namespace zo::pinned
