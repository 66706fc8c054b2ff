#include "pinned_memory/bucket_ring.h"

#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zo::pinned {
namespace {

// Slots start on page boundaries: no slot shares a page (or a cache line) with its neighbour.
constexpr std::size_t kSlotAlignment = 4096;

}  // namespace

struct BucketRing::State {
  struct SlotState {
    bool held = false;
    std::uint64_t turn = 0;  // the acquire() ticket allowed to take the slot next
  };

  PinnedBuffer buffer;
  std::size_t count = 0;
  std::size_t bytes = 0;
  std::size_t stride = 0;
  std::mutex mutex;
  std::condition_variable released;
  std::vector<SlotState> slots;
  std::uint64_t next_ticket = 0;

  void put(std::size_t index) {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      SlotState& slot = slots[index];
      slot.held = false;
      slot.turn += count;
    }
    released.notify_all();
  }
};

// ---- Slot ---------------------------------------------------------------------------------------

BucketRing::Slot::~Slot() {
  give_back();
}

BucketRing::Slot::Slot(Slot&& other) noexcept
    : ring_(std::move(other.ring_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      index_(std::exchange(other.index_, 0)) {}

BucketRing::Slot& BucketRing::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    give_back();
    ring_ = std::move(other.ring_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    index_ = std::exchange(other.index_, 0);
  }
  return *this;
}

void BucketRing::Slot::give_back() noexcept {
  if (!ring_) return;
  try {
    ring_->put(index_);
  } catch (...) {  // only a failing mutex; the slot stays held rather than terminate
  }
  ring_.reset();
  data_ = nullptr;
  bytes_ = 0;
  index_ = 0;
}

// ---- BucketRing ---------------------------------------------------------------------------------

BucketRing::BucketRing(std::size_t slot_count, std::size_t slot_bytes, const PinOptions& options) {
  if (slot_count == 0 || slot_bytes == 0) {
    throw std::invalid_argument("BucketRing: needs at least one slot of at least one byte, got " +
                                std::to_string(slot_count) + " slots of " +
                                std::to_string(slot_bytes) + " bytes");
  }
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  if (slot_bytes > max - (kSlotAlignment - 1) ||
      (slot_bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment > max / slot_count) {
    throw std::invalid_argument("BucketRing: " + std::to_string(slot_count) + " slots of " +
                                std::to_string(slot_bytes) + " bytes overflow size_t");
  }
  auto state = std::make_shared<State>();
  state->count = slot_count;
  state->bytes = slot_bytes;
  state->stride = (slot_bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  state->slots.resize(slot_count);
  for (std::size_t i = 0; i < slot_count; ++i)
    state->slots[i].turn = i;
  state->buffer = PinnedBuffer(state->stride * slot_count, options);
  state_ = std::move(state);
}

BucketRing::~BucketRing() = default;
BucketRing::BucketRing(BucketRing&&) noexcept = default;
BucketRing& BucketRing::operator=(BucketRing&&) noexcept = default;

BucketRing::Slot BucketRing::acquire() {
  if (!state_) throw std::logic_error("BucketRing::acquire on a moved-from ring");
  State& ring = *state_;
  std::unique_lock<std::mutex> lock(ring.mutex);
  const std::uint64_t ticket = ring.next_ticket++;
  const std::size_t index = static_cast<std::size_t>(ticket % ring.count);
  State::SlotState& slot = ring.slots[index];
  ring.released.wait(lock, [&] { return !slot.held && slot.turn == ticket; });
  slot.held = true;
  lock.unlock();

  Slot out;
  out.ring_ = state_;
  out.data_ = static_cast<std::byte*>(ring.buffer.data()) + index * ring.stride;
  out.bytes_ = ring.bytes;
  out.index_ = index;
  return out;
}

void BucketRing::release(Slot& slot) {
  if (!slot.ring_) {
    throw std::invalid_argument(
        "BucketRing::release: the slot is empty (already released, or moved from)");
  }
  if (slot.ring_ != state_) {
    throw std::invalid_argument("BucketRing::release: slot " + std::to_string(slot.index_) +
                                " belongs to another ring");
  }
  state_->put(slot.index_);
  slot.ring_.reset();
  slot.data_ = nullptr;
  slot.bytes_ = 0;
  slot.index_ = 0;
}

std::size_t BucketRing::slot_count() const noexcept {
  return state_ ? state_->count : 0;
}

std::size_t BucketRing::slot_bytes() const noexcept {
  return state_ ? state_->bytes : 0;
}

std::size_t BucketRing::slot_stride() const noexcept {
  return state_ ? state_->stride : 0;
}

const PinnedBuffer& BucketRing::pinned() const noexcept {
  static const PinnedBuffer kEmpty;
  return state_ ? state_->buffer : kEmpty;
}

}  // namespace zo::pinned
