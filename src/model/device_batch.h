// A model's token and target buffers on the device, filled from host vectors through two
// alternating staging buffers: the copy runs later on the stream, so the host data it reads must
// stay untouched until then, while the caller may reuse its vectors at once. The staging is
// page-locked on a GPU: a copy from pageable memory would first wait for the stream (CUDA stages
// it through the driver), so the host could not enqueue a micro-batch while the last one runs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "device/device.h"
#include "pinned_memory/pinned_buffer.h"

namespace zo::model {

class DeviceBatch {
 public:
  // tokens, targets: (B*T) int32 device buffers the model allocated.
  DeviceBatch(dev::Device& device, std::int32_t* tokens, std::int32_t* targets, std::size_t BT,
              int vocab_size);
  ~DeviceBatch();  // waits for the staged copies; never throws
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  // Checks sizes and ids (std::invalid_argument naming the problem) and enqueues the copies.
  void set(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
           dev::Stream& s);

  // The token at index i of the (B*T) tokens alone (a decode step's), checked and staged alike.
  void set_token(std::size_t i, std::int32_t token, dev::Stream& s);

  const std::int32_t* tokens() const { return tokens_; }
  const std::int32_t* targets() const { return targets_; }

 private:
  void check_ids(const std::vector<std::int32_t>& ids) const;
  int next_stage();  // the staging slot to fill, once its last copy is done

  dev::Device& device_;
  std::int32_t *tokens_, *targets_;  // (B,T) device
  std::size_t BT_;
  int vocab_size_;
  pinned::PinnedBuffer staged_[2];  // (2, B*T) int32 each: the tokens, then the targets
  std::unique_ptr<dev::Event> staged_done_[2];
  int stage_ = 0;
};

}  // namespace zo::model
