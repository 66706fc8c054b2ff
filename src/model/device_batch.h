// A model's token and target buffers on the device, filled from host vectors through two
// alternating staging copies: the copy runs later on the stream, so the host data it reads must
// stay untouched until then, while the caller may reuse its vectors at once.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "device/device.h"

namespace zo::model {

class DeviceBatch {
 public:
  // tokens, targets: (B*T) int32 device buffers the model allocated.
  DeviceBatch(dev::Device& device, std::int32_t* tokens, std::int32_t* targets, std::size_t BT,
              int vocab_size);

  // Checks sizes and ids (std::invalid_argument naming the problem) and enqueues the copies.
  void set(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
           dev::Stream& s);

  const std::int32_t* tokens() const { return tokens_; }
  const std::int32_t* targets() const { return targets_; }

 private:
  dev::Device& device_;
  std::int32_t *tokens_, *targets_;  // (B,T) device
  std::size_t BT_;
  int vocab_size_;
  std::vector<std::int32_t> staged_tokens_[2], staged_targets_[2];
  std::unique_ptr<dev::Event> staged_done_[2];
  int stage_ = 0;
};

}  // namespace zo::model
