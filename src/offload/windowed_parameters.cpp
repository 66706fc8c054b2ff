#include "offload/windowed_parameters.h"

#include <stdexcept>

namespace zo::offload {

WindowedParameters::WindowedParameters(dev::Device& device, dev::Stream& compute,
                                       const model::ParameterLayout& layout, const void* host,
                                       int slots)
    : host_(host), h2d_(device.create_stream(/*high_priority=*/true)) {
  for (std::size_t g = 0; g < layout.groups().size(); ++g) {
    begin_.push_back(device.create_event());
    end_.push_back(device.create_event());
  }
  window_ = std::make_unique<ParamWindow>(device, compute, *h2d_, layout, slots, false,
                                          /*forward_only=*/true);
  const std::size_t esize = dtype_size(device.act_dtype());
  for (std::size_t g = 0; g < layout.groups().size(); ++g) {
    if (!ParamWindow::resident(layout, g)) continue;
    const model::Range& r = layout.groups()[g];
    device.copy_to_device(window_->resident_base(g),
                          static_cast<const char*>(host) + r.begin * esize, r.size() * esize,
                          *h2d_);
  }
  h2d_->synchronize();
}

WindowedParameters::~WindowedParameters() {
  dev::synchronize_quietly(*h2d_);
}

void WindowedParameters::before_read(std::size_t group) {
  window_->enter(
      group, host_, [](std::size_t) { return true; },
      [&](std::size_t h) {
        return ParamWindow::FillEvents{*begin_[h], *end_[h]};
      });
}

void* WindowedParameters::grad(std::size_t) {
  throw std::logic_error("WindowedParameters: parameters read through a window have no gradients");
}

}  // namespace zo::offload
