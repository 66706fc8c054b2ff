// Everything a training run sets up before its first step, in the order that refuses bad input
// before any large allocation: ranks and the cross-rank flag check, the model spec (from the
// checkpoint when resuming), the data, the device, the memory plan (which also picks resident or
// offload mode), the host optimizer state, the updater, the model, and the initial or resumed
// weights. The training loop (trainer.cpp) only runs steps on it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "comm/comm.h"
#include "data/loader.h"
#include "device/device.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/spec.h"
#include "optim/host_optimizer.h"
#include "report/trace.h"
#include "train/config.h"
#include "train/loss_scaler.h"
#include "train/run_lineage.h"
#include "train/run_outputs.h"
#include "train/updater.h"

namespace zo::train {

struct Session {
  // Throws with the problem and the fix for bad flags, specs, data, checkpoints, or a plan that
  // does not fit; nothing large is allocated before those checks.
  explicit Session(const TrainConfig& config);
  ~Session();  // waits for queued device work; never throws

  TrainConfig cfg;
  std::unique_ptr<comm::Communicator> comm;  // the job's ranks (one: a single process)
  int ranks = 1, rank = 0;
  int local_ranks = 1;  // ranks on this machine (they share its cores, memory and GPUs)
  // Test hook (docs/testing.md): ZO_TEST_STALL=<rank>:<step> makes that rank stop responding
  // at the start of that step (>= 1) for 4 x --comm-timeout, as a hung rank would. Only the
  // environment of a data-parallel job sets it; nothing read from files can.
  std::optional<std::int64_t> stall_step;
  std::vector<std::vector<optim::OwnedRange>> partitions;  // data parallel: every rank's
  model::ModelSpec spec;
  std::unique_ptr<model::ParameterLayout> layout;
  int T = 0;  // sequence length
  std::optional<nlohmann::json> resume_state;
  std::filesystem::path resume_dir;
  std::vector<std::string> notes;  // what the user should know before the first step
  std::string run_id;              // train/run_lineage.h
  data::Loaders loaders;
  std::unique_ptr<dev::Device> dev;
  std::unique_ptr<dev::Stream> stream;  // forward and backward
  std::unique_ptr<optim::HostOptimizer> opt;
  bool resident = false;  // optimizer state on the device (TrainConfig::mode)
  // Resumed at or past --steps: nothing else was opened, and the run trains nothing.
  bool finished = false;
  // Offload, grad_accum > 1: micro-batches summed on the device (TrainConfig::grad_accum_on).
  bool accumulate_on_device = false;
  int param_window = 0;  // > 0: stream mode's window (TrainConfig::mode)
  report::Trace trace;
  std::unique_ptr<Updater> updater;
  std::unique_ptr<model::Model> model;
  DirClaim checkpoint_claim;    // what check_outputs found in --checkpoint-dir
  DirLock checkpoint_lock;      // held by rank 0 for the run
  std::string metrics_foreign;  // why --metrics is not this run's (resumed, --overwrite)
  std::int64_t start_step = 0, tokens = 0;
  LossScaler scaler;

  // The mean validation loss over cfg.eval_batches batches of every rank.
  double evaluate();
  // What trainer_state.json records at a checkpoint after `step` steps.
  nlohmann::json trainer_state(std::int64_t step) const;

 private:
  // The constructor's steps, in order.
  void join_job();
  void resolve_model();
  void check_state_format();
  void check_checkpoint_space();
  void check_outputs();
  void open_data();
  void open_device_and_plan();
  void restore_gemm_choices();
  void make_optimizer_state();
  void init_master();
  void make_updater_and_model();
  void init_weights();
  void claim_outputs();
  // 0 (all cores) for a single rank per machine, else the cores over the ranks on this machine.
  int core_share() const;
  int adam_threads_default() const;
  offload::EngineConfig engine_config() const;
};

}  // namespace zo::train
