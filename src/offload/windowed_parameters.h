// Parameters that stay in host memory, read through a window of device slots: `eval` and
// `sample` on a model whose weights do not fit the device (param_window.h; no gradients, no
// optimizer). The embeddings and the final group are uploaded once; the blocks stream, the end of
// one forward prefetching the next one's first blocks (a decode step is a forward of one row).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "device/device.h"
#include "model/layout.h"
#include "model/parameter_store.h"
#include "offload/param_window.h"

namespace zo::offload {

class WindowedParameters final : public model::ParameterStore {
 public:
  // `host`: every parameter in the device's dtype, layout order; it must stay valid (and
  // unchanged) while the store lives, and be page-locked for the copies to overlap compute.
  WindowedParameters(dev::Device& device, dev::Stream& compute,
                     const model::ParameterLayout& layout, const void* host, int slots);
  ~WindowedParameters() override;  // waits for the copies; never throws

  const void* param(std::size_t offset) override { return window_->param(offset); }
  const void* params() override { return nullptr; }
  void before_read(std::size_t group) override;
  void* grad(std::size_t offset) override;  // throws: read only

 private:
  const void* host_;
  std::unique_ptr<dev::Stream> h2d_;
  std::vector<std::unique_ptr<dev::Event>> begin_, end_;  // per group: its last copy
  std::unique_ptr<ParamWindow> window_;
};

}  // namespace zo::offload
