// A model's activations as one device allocation carved in a fixed order. The model writes the
// order once as a walk, `walk(place)` calling place(bytes) per buffer; sizing and carving run the
// same walk, so the planner's estimate and the real allocation cannot disagree.
#pragma once

#include <cstddef>
#include <vector>

#include "device/device.h"

namespace zo::model {

inline constexpr std::size_t kActivationAlign = 64;  // every buffer starts on a cache line

inline std::size_t activation_align_up(std::size_t x) {
  return (x + kActivationAlign - 1) / kActivationAlign * kActivationAlign;
}

template <class Walk>
std::size_t arena_bytes(Walk&& walk) {
  std::size_t total = 0;
  walk([&](std::size_t bytes) { total += activation_align_up(bytes); });
  return total;
}

// The buffers of one walk, handed out in walk order.
class CarvedArena {
 public:
  template <class Walk>
  CarvedArena(dev::Device& device, Walk&& walk)
      : buffer_(device.alloc(arena_bytes(walk), "activations")) {
    std::size_t used = 0;
    walk([&](std::size_t bytes) {
      ptrs_.push_back(static_cast<char*>(buffer_.data()) + used);
      used += activation_align_up(bytes);
    });
  }
  void* next() { return ptrs_.at(k_++); }
  float* next_f32() { return static_cast<float*>(next()); }
  std::int32_t* next_i32() { return static_cast<std::int32_t*>(next()); }

 private:
  dev::Buffer buffer_;
  std::vector<void*> ptrs_;
  std::size_t k_ = 0;
};

}  // namespace zo::model
