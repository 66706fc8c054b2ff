// The one interface between a model and whoever provides its parameters and takes its gradients
// (docs/architecture.md, "One gradient bucket"), and its flat-buffer implementation.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace zo::model {

// The one interface between the model and whoever provides its parameters and takes its
// gradients (docs/architecture.md, "One gradient bucket").
// - param(offset): the device address of the parameter at layout element `offset` (act dtype);
//   the tensor starting there is contiguous. Valid for the ops enqueued until the next
//   before_read.
// - params(): the (layout.size()) parameters as one flat device buffer, for a recording's key
//   (Model::use_graphs).
// - before_read(g): the model calls it before enqueueing the ops that read parameter group g
//   (ParameterLayout::groups()); until the next before_read, ops read the parameters of group g
//   only. Forward announces 0, 1, ..., n_layer + 1 and then the LM head's group (0 when tied);
//   backward the head's group, n_layer + 1, n_layer, ..., 1 (the embedding backward reads no
//   parameter). The offload engine makes the stream wait there for that group's upload only.
// - grad(offset): where backward accumulates (+=) the gradient of the tensor starting at layout
//   element `offset` (the whole tensor, act dtype; with TensorInfo::joins_next, also the tensors
//   fused with it). Tensors are written in descending layout order, except wte, which a tied LM
//   head writes first and the embedding backward writes again last.
// - complete_from(x): after every op that writes parameter gradients, backward says that every
//   tensor at offset >= x other than wte is final for this backward; complete_from(0) comes last.
//   The offload engine streams buckets to the host from these calls (docs/offload.md).
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  virtual const void* param(std::size_t offset) = 0;
  virtual const void* params() = 0;
  virtual void before_read(std::size_t group) { (void)group; }
  virtual void* grad(std::size_t offset) = 0;
  virtual void complete_from(std::size_t offset) { (void)offset; }
  // params() and grad() always give the same pointers and before_read / complete_from do nothing,
  // so a recording of the model's work on this store may be replayed (Model::use_graphs).
  virtual bool replayable() const { return false; }
};

// Flat buffers in layout order: parameters and (for backward) gradients, act dtype, device.
class FlatParameters final : public ParameterStore {
 public:
  FlatParameters(const void* params, void* grads, DType act) noexcept
      : params_(static_cast<const char*>(params)),
        grads_(static_cast<char*>(grads)),
        esize_(dtype_size(act)) {}
  const void* param(std::size_t offset) override;
  const void* params() override { return params_; }
  void* grad(std::size_t offset) override;
  bool replayable() const override { return true; }

 private:
  const char* params_;
  char* grads_;
  std::size_t esize_;
};

}  // namespace zo::model
