// A ring of fixed-size slots carved from one PinnedBuffer: the staging area between the GPU's
// copy streams and the CPU (gradient buckets coming down, parameters going up). A slot may be
// written again only after the copy that last used it has completed; the ring enforces that
// with a fence per slot, so it needs nothing from the device layer.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>

#include "pinned_memory/pinned_buffer.h"

namespace zo::pinned {

// Blocks until the copy that reads or writes a slot has completed, e.g. the engine's
// `[ev] { ev->synchronize(); }` for an event recorded after the copy. It is called exactly
// once, from whichever thread next acquires the slot (or the thread destroying the ring), and
// never under the ring's lock. If it throws, the exception propagates from acquire() and the
// slot keeps its fence for the next turn.
using Fence = std::function<void()>;

// Threading: every member may be called from any thread; any number of producers (acquire)
// and consumers (release) may run at once. The t-th acquire() to take the ring's lock gets slot
// t % slot_count(), i.e. slots are handed out strictly round-robin. A slot is never held by two
// Slot objects at once.
class BucketRing {
  struct State;

 public:
  // One slot, held from acquire() until release() (or until the Slot is destroyed, which
  // releases it without a fence). Holds a reference to the ring's memory, so the memory stays
  // valid while any Slot is alive even if the BucketRing object is gone.
  class Slot {
   public:
    Slot() noexcept = default;
    ~Slot();
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

    void* data() const noexcept { return data_; }
    std::size_t bytes() const noexcept { return bytes_; }
    std::size_t index() const noexcept { return index_; }
    explicit operator bool() const noexcept { return data_ != nullptr; }

    // bytes() / sizeof(T) elements, floor: a slot sized for the largest bucket is shared by
    // smaller ones.
    template <class T>
    std::span<T> span() const noexcept {
      return {static_cast<T*>(data_), bytes_ / sizeof(T)};
    }

   private:
    friend class BucketRing;
    void give_back() noexcept;

    std::shared_ptr<State> ring_;
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
    std::size_t index_ = 0;
  };

  // slot_count slots of slot_bytes each (every slot starts on a 4 KiB boundary) in one
  // PinnedBuffer made with `options`. Throws std::invalid_argument for zero slots, zero bytes
  // or a total that overflows, and what PinnedBuffer throws.
  BucketRing(std::size_t slot_count, std::size_t slot_bytes, const PinOptions& options = {});
  // Waits (via their fences) for the copies still using released slots, once the last Slot is
  // gone too, then frees the memory: a DMA never targets freed pages. Never throws.
  ~BucketRing();
  BucketRing(BucketRing&&) noexcept;
  BucketRing& operator=(BucketRing&&) noexcept;
  BucketRing(const BucketRing&) = delete;
  BucketRing& operator=(const BucketRing&) = delete;

  // The next slot in round-robin order. Blocks while that slot is still held, then runs the
  // fence it was released with (outside the lock). A thread holding all slots and acquiring
  // again waits forever for a release from another thread. Throws what the fence throws, and
  // std::logic_error on a moved-from ring.
  Slot acquire();

  // Gives the slot back; the next acquire() of it first calls `fence` (an empty fence: reusable
  // at once). The slot becomes empty. Slots may be released in any order, but are reused in
  // ring order. Throws std::invalid_argument for an empty slot or one from another ring.
  void release(Slot& slot, Fence fence = {});
  void release(Slot&& slot, Fence fence = {}) { release(slot, std::move(fence)); }

  std::size_t slot_count() const noexcept;
  std::size_t slot_bytes() const noexcept;
  std::size_t slot_stride() const noexcept;  // bytes between slot starts
  // The memory behind all slots: is_pinned() says whether copies from it are truly async.
  const PinnedBuffer& pinned() const noexcept;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace zo::pinned
