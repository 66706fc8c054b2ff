#include "model/device_batch.h"

#include <stdexcept>
#include <string>

namespace zo::model {

DeviceBatch::DeviceBatch(dev::Device& device, std::int32_t* tokens, std::int32_t* targets,
                         std::size_t BT, int vocab_size)
    : device_(device), tokens_(tokens), targets_(targets), BT_(BT), vocab_size_(vocab_size) {
  for (auto& e : staged_done_)
    e = device.create_event();
}

void DeviceBatch::set(const std::vector<std::int32_t>& tokens,
                      const std::vector<std::int32_t>& targets, dev::Stream& s) {
  if (tokens.size() != BT_ || (!targets.empty() && targets.size() != BT_)) {
    throw std::invalid_argument("batch has " + std::to_string(tokens.size()) + " tokens and " +
                                std::to_string(targets.size()) + " targets; the model expects " +
                                std::to_string(BT_) + " (B x T)");
  }
  for (const auto* v : {&tokens, &targets}) {
    for (std::int32_t x : *v) {
      if (x < 0 || x >= vocab_size_) {
        throw std::invalid_argument("token id " + std::to_string(x) +
                                    " is outside the model's vocabulary [0, " +
                                    std::to_string(vocab_size_) + ")");
      }
    }
  }
  const int k = stage_;
  stage_ ^= 1;
  staged_done_[k]->synchronize();
  staged_tokens_[k] = tokens;
  staged_targets_[k] = targets;
  device_.copy_to_device(tokens_, staged_tokens_[k].data(), BT_ * 4, s);
  if (!targets.empty()) device_.copy_to_device(targets_, staged_targets_[k].data(), BT_ * 4, s);
  device_.record(*staged_done_[k], s);
}

}  // namespace zo::model
