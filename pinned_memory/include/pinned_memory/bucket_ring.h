// A ring of fixed-size slots carved from one PinnedBuffer: the staging area between the GPU's
// copy stream and a CPU thread (the offload engine's gradient buckets on their way to the
// accumulate thread). A slot is handed out again only after its holder released it; the holder
// releases it once the copy into it has landed and it has been read, so the ring needs nothing
// from the device layer.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "pinned_memory/pinned_buffer.h"

namespace zo::pinned {

// Threading: every member may be called from any thread; any number of producers (acquire)
// and consumers (release) may run at once. The t-th acquire() to take the ring's lock gets slot
// t % slot_count(), i.e. slots are handed out strictly round-robin. A slot is never held by two
// Slot objects at once.
class BucketRing {
  struct State;

 public:
  // One slot, held from acquire() until release() or until the Slot is destroyed. Holds a reference
  // to the ring's memory, so the memory stays valid while any Slot is alive even if the BucketRing
  // object is gone.
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
  // The memory lives until the last Slot is gone too. Whoever enqueued copies into slots waits
  // for them before destroying the ring (the engine synchronizes its copy stream).
  ~BucketRing();
  BucketRing(BucketRing&&) noexcept;
  BucketRing& operator=(BucketRing&&) noexcept;
  BucketRing(const BucketRing&) = delete;
  BucketRing& operator=(const BucketRing&) = delete;

  // The next slot in round-robin order. Blocks while that slot is still held (back-pressure on
  // the producer). A thread holding all slots and acquiring again waits forever for a release
  // from another thread. Throws std::logic_error on a moved-from ring.
  Slot acquire();

  // Gives the slot back; the slot becomes empty. Slots may be released in any order, but are
  // reused in ring order. Throws std::invalid_argument for an empty slot or one from another ring.
  void release(Slot& slot);
  void release(Slot&& slot) { release(slot); }

  std::size_t slot_count() const noexcept;
  std::size_t slot_bytes() const noexcept;
  std::size_t slot_stride() const noexcept;  // bytes between slot starts
  // The memory behind all slots: is_pinned() says whether copies from it are truly async.
  const PinnedBuffer& pinned() const noexcept;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace zo::pinned
