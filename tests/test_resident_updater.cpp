// The resident updater's step on the host backend: finish_gradients queues the update the host
// would make (the device's step gate from the device's norm) before it waits, apply only counts
// it, and a skipped step leaves the state as it was. The reference is the host optimizer (cpu_adam)
// given the multiplier worked out from the gradient here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "device/make_device.h"
#include "model/layout.h"
#include "model/spec.h"
#include "optim/host_optimizer.h"
#include "train/updater.h"

namespace {

using zo::StepGateRule;
using zo::model::ParameterLayout;
using zo::optim::HostOptimizer;
using zo::train::StepPlan;

struct Rig {
  ParameterLayout layout{zo::model::load_model_spec("tiny")};
  zo::optim::OptimizerConfig cfg = [] {
    zo::optim::OptimizerConfig c;
    c.adam.weight_decay = 0.1f;
    return c;
  }();
  HostOptimizer state{layout, cfg}, reference{layout, cfg};
  std::unique_ptr<zo::dev::Device> dev = zo::dev::make_host_device({});
  std::unique_ptr<zo::dev::Stream> stream = dev->create_stream();
  std::unique_ptr<zo::train::Updater> up;
  std::vector<float> grads = std::vector<float>(layout.size());

  Rig() {
    zo::model::init_weights(layout, 5, state.master().data());
    std::copy(state.master().begin(), state.master().end(), reference.master().begin());
    up = zo::train::make_resident_updater(*dev, *stream, layout, state, 1);
    up->load_state();
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 30.0f);
    for (float& g : grads)
      g = normal(rng);
  }
  // One backward's worth: the gradient written where the model would write it.
  void backward() {
    up->begin_step(false);
    up->begin_micro_batch(0);
    dev->copy_to_device(up->parameters().grad(0), grads.data(), grads.size() * 4, *stream);
  }
  std::vector<float> device_master() {
    return std::vector<float>(up->host_state().master().begin(), up->host_state().master().end());
  }
};

double sum_of_squares(const std::vector<float>& g) {
  double s = 0.0;
  for (float x : g)
    s += double(x) * x;
  return s;
}

TEST(ResidentUpdater, FinishGradientsQueuesTheUpdateTheHostWouldMake) {
  Rig r;
  const float scale = 64.0f, max_norm = 1.0f;
  r.backward();
  const zo::train::GradStats st = r.up->finish_gradients({1e-3f, {scale, max_norm, false}});
  const double sumsq = sum_of_squares(r.grads);
  EXPECT_NEAR(st.sumsq, sumsq, 1e-5 * sumsq);
  // Clipped: the norm of the unscaled gradient is far above 1.
  const double norm = std::sqrt(st.sumsq) / scale;
  ASSERT_GT(norm, 10.0);
  const float mult = float(double(max_norm) / (norm + 1e-6)) / scale;

  const std::vector<float> initial(r.reference.master().begin(), r.reference.master().end());
  EXPECT_NE(r.device_master(), initial) << "the update is on the device before apply";
  r.reference.step({r.grads.data(), r.grads.size(), zo::DType::kF32}, 1e-3f, mult);
  EXPECT_EQ(r.device_master(),
            std::vector<float>(r.reference.master().begin(), r.reference.master().end()))
      << "the device's gate and AdamW against cpu_adam with the multiplier worked out here";
  EXPECT_EQ(r.state.state().step, 0) << "counted only by apply";
  r.up->apply(1e-3f, mult);
  EXPECT_EQ(r.state.state().step, 1);
  EXPECT_THROW(r.up->apply(1e-3f, mult), std::logic_error) << "one update, counted once";
}

TEST(ResidentUpdater, ASkippedStepChangesNothingAndCannotBeApplied) {
  Rig r;
  const std::vector<float> before(r.state.master().begin(), r.state.master().end());
  for (const StepGateRule rule : {StepGateRule{1.0f, 0.0f, true},  // forced
                                  StepGateRule{1.0f, 0.0f, false}}) {
    if (!rule.force_skip) r.grads[123] = INFINITY;  // an overflow
    r.backward();
    const zo::train::GradStats st = r.up->finish_gradients({1e-3f, rule});
    EXPECT_EQ(std::isfinite(st.sumsq), rule.force_skip);
    EXPECT_THROW(r.up->apply(1e-3f, 1.0f), std::logic_error);
    EXPECT_EQ(r.device_master(), before);
    EXPECT_EQ(r.state.state().step, 0);
  }
}

TEST(ResidentUpdater, AnUpdateTheTrainerDidNotCountIsCaught) {
  Rig r;
  r.backward();
  r.up->finish_gradients({1e-3f, {1.0f, 0.0f, false}});
  // The trainer decided to skip (it would not, by the same rule): the next step refuses.
  EXPECT_THROW(r.up->begin_step(false), std::logic_error);
}

}  // namespace
