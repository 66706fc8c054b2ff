// The one exception type of the checkpoint module: every message names the file (and the tensor
// or entry) and says what is wrong and what to do about it.
#pragma once

#include <stdexcept>

namespace zo::ckpt {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace zo::ckpt
