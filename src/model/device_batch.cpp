#include "model/device_batch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "device/make_device.h"

namespace zo::model {

DeviceBatch::DeviceBatch(dev::Device& device, std::int32_t* tokens, std::int32_t* targets,
                         std::size_t BT, int vocab_size)
    : device_(device), tokens_(tokens), targets_(targets), BT_(BT), vocab_size_(vocab_size) {
  for (int k = 0; k < 2; ++k) {
    staged_[k] =
        pinned::PinnedBuffer(2 * BT * sizeof(std::int32_t), dev::staging_pin_options(device, true));
    staged_done_[k] = device.create_event();
  }
}

DeviceBatch::~DeviceBatch() {
  for (const auto& e : staged_done_) {
    try {
      e->synchronize();
    } catch (const std::exception&) {
      // The stream's error reaches whoever synchronizes it; the copies are over either way.
    }
  }
}

void DeviceBatch::set(const std::vector<std::int32_t>& tokens,
                      const std::vector<std::int32_t>& targets, dev::Stream& s) {
  if (tokens.size() != BT_ || (!targets.empty() && targets.size() != BT_)) {
    throw std::invalid_argument("batch has " + std::to_string(tokens.size()) + " tokens and " +
                                std::to_string(targets.size()) + " targets; the model expects " +
                                std::to_string(BT_) + " (B x T)");
  }
  check_ids(tokens);
  check_ids(targets);
  const int k = next_stage();
  const std::span<std::int32_t> staged = staged_[k].span<std::int32_t>();
  std::copy(tokens.begin(), tokens.end(), staged.begin());
  std::copy(targets.begin(), targets.end(), staged.begin() + std::ptrdiff_t(BT_));
  device_.copy_to_device(tokens_, staged.data(), BT_ * 4, s);
  if (!targets.empty()) device_.copy_to_device(targets_, staged.data() + BT_, BT_ * 4, s);
  device_.record(*staged_done_[k], s);
}

void DeviceBatch::set_token(std::size_t i, std::int32_t token, dev::Stream& s) {
  if (i >= BT_) {
    throw std::invalid_argument("token index " + std::to_string(i) + " is outside the batch of " +
                                std::to_string(BT_) + " tokens");
  }
  check_ids({token});
  const int k = next_stage();
  std::int32_t* staged = staged_[k].span<std::int32_t>().data();
  *staged = token;
  device_.copy_to_device(tokens_ + i, staged, 4, s);
  device_.record(*staged_done_[k], s);
}

void DeviceBatch::check_ids(const std::vector<std::int32_t>& ids) const {
  for (std::int32_t x : ids) {
    if (x < 0 || x >= vocab_size_) {
      throw std::invalid_argument("token id " + std::to_string(x) +
                                  " is outside the model's vocabulary [0, " +
                                  std::to_string(vocab_size_) + ")");
    }
  }
}

int DeviceBatch::next_stage() {
  const int k = stage_;
  stage_ ^= 1;
  staged_done_[k]->synchronize();
  return k;
}

}  // namespace zo::model
