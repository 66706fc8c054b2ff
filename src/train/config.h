// Everything a training run is configured with, resolved and validated before any allocation.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/state_format.h"
#include "model/spec.h"
#include "optim/state_pager.h"
#include "train/schedule.h"

namespace zo::train {

// Bounds of the count flags (TrainConfig::validate).
inline constexpr int kMaxMicroBatch = 1 << 16, kMaxGradAccum = 4096, kMaxEvalBatches = 1 << 20;
inline constexpr std::int64_t kMaxSteps = std::int64_t{1} << 40;

// The most threads --threads and --adam-threads take.
inline constexpr int kMaxThreads = 4096;

struct TrainConfig {
  // model
  std::string model = "tiny";  // preset name or JSON spec path
  std::string init_from;       // Hugging Face GPT-2 safetensors to start from ("" = GPT-2 init)
  std::uint64_t seed = 1337;   // init and data order
  bool recompute = false;

  // data
  std::string data = "synthetic";  // file, directory, glob, or "synthetic"
  std::string data_format = "auto";
  std::string val_data;  // separate validation data ("" = hold out val_fraction)
  double val_fraction = 0.05;

  // batch
  int micro_batch = 4;  // B
  int seq_len = 0;      // T; 0 = the model's block_size
  int grad_accum = 1;   // micro-batches per optimizer step
  std::int64_t steps = 100;

  // optimizer
  LrSchedule lr;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  bool decay_embeddings = false;  // by default decay applies to matrices only
  bool decay_biases_and_norms = false;
  float grad_clip = 1.0f;  // global-norm clip; 0 = off
  StateFormat optimizer_state = StateFormat::kF32;
  DType master_weights = DType::kF32;  // kBF16: rounded stochastically (offload mode)
  int adam_threads = 0;
  // Non-empty: master, m and v in an unnamed, preallocated file in this directory instead of
  // host memory (offload and stream modes; docs/state_dir.md), paged in chunks of at most
  // state_chunk_elements (--state-chunk; whole q8 blocks).
  std::string state_dir;
  std::size_t state_chunk_elements = optim::kDefaultChunkElements;

  // device and mode
  std::string device = "auto";  // auto (cuda if a usable GPU is present, else host) | host | cuda
  // Where the optimizer state lives: resident (on the device, AdamW on the device), offload
  // (fp32 master, m, v on the host, CPU Adam), or auto (resident when it fits on a GPU; offload
  // on the host backend or when the GPU is too small), or stream (offload with a window of
  // param_window blocks on the device instead of every parameter; auto picks it when offload
  // does not fit the device and the window does).
  std::string mode = "auto";
  int param_window = 0;  // stream mode's slots (>= 2, <= n_layer); 0 = default_param_window
  // Offload mode with grad_accum > 1: where the micro-batches are summed in fp32: device (one
  // bucket per step to the host), host (every micro-batch's buckets), or auto (the device when
  // the plan fits with the fp32 sum there). Resident mode always sums on the device.
  std::string grad_accum_on = "auto";
  // CUDA: replay forward and backward as CUDA Graph recordings from the second step (resident
  // mode; the offload engine's hooks between ops need eager launches). --no-cuda-graphs: eager.
  bool cuda_graphs = true;
  std::string precision =
      "auto";  // device dtype: auto (bf16 on cuda, fp32 on host), fp32, bf16, fp16
  // Loss scaling: auto (dynamic for fp16, off otherwise), dynamic, off, or a fixed number.
  std::string loss_scale = "auto";
  std::int64_t loss_scale_window = 1000;  // overflow-free steps before the scale doubles
  float loss_scale_backoff = 0.5f;        // factor on overflow
  float loss_scale_min = 1.0f, loss_scale_max = 16777216.0f;  // dynamic range [1, 2^24]
  // Testing hook (not a CLI flag): treat these steps' gradients as overflowed (1-based).
  std::vector<std::int64_t> inject_overflow_steps;
  // Testing hook (not a CLI flag): throw at this step (1-based; 0: never) once its forward and
  // backward are enqueued, before the host waits for them, as an error mid-step would.
  std::int64_t inject_error_step = 0;
  // Offload engine (docs/offload.md). Bucket: gradient bytes streamed to the host at a
  // time. DPU: one-step delayed parameter update after dpu_warmup ordinary steps.
  std::size_t bucket_size = std::size_t{32} << 20;
  bool dpu = false;
  std::int64_t dpu_warmup = 10;
  bool pin = true;                // page-lock host staging buffers (--no-pin: pageable)
  std::string trace;              // Chrome trace-event JSON path ("" = none)
  std::size_t device_memory = 0;  // device capacity in bytes; 0 = all of it
  std::size_t host_memory = 0;    // host memory to plan for; 0 = MemAvailable (this rank's share)
  int threads = 0;                // host backend compute threads; 0 = all cores
  // Data parallel (mpirun -np N): seconds a collective may wait for the other ranks before the
  // job stops with an error on every rank (a rank died, hangs or diverged).
  double comm_timeout = 300.0;

  // evaluation, checkpoints, output
  std::int64_t eval_interval = 0;  // steps; 0 = only at the end
  int eval_batches = 8;
  std::string checkpoint_dir;            // "" = no checkpoints
  std::int64_t checkpoint_interval = 0;  // steps; 0 = only at the end
  int keep_last = 3;                     // this run's checkpoints kept by rotation; 0 = all
  // Start even where another run's checkpoints (or a fresh run's --metrics file) exist: same-
  // numbered checkpoints and that metrics file are replaced (train/run_lineage.h).
  bool overwrite = false;
  // Resume a checkpoint whose optimizer state is in another format (--optimizer-state: q8 is
  // dequantized, fp32 or bf16 quantized or rounded; --master-weights: bf16 widened, fp32 rounded
  // to nearest even). Without it a different format is refused.
  bool convert_optimizer_state = false;
  // Stop the run (non-zero exit) after this many consecutive steps with non-finite gradients;
  // 0 = never. Dynamic fp16 loss scaling skips a few while it finds its scale.
  std::int64_t max_nonfinite_steps = 20;
  std::string resume;             // checkpoint directory, or "latest" (in checkpoint_dir)
  std::string metrics;            // JSONL path ("" = none)
  std::int64_t log_interval = 1;  // progress line every N steps
  bool quiet = false;

  // The to_json() keys the command line gave explicitly. A resumed run takes every setting that
  // defines the run (train/resume_config.h) from its checkpoint unless its key is in here.
  std::set<std::string> explicit_keys;

  // Cross-field checks; throw std::invalid_argument naming the flags and the fix. The first
  // needs no model spec and runs before anything is opened.
  void validate_flags() const;
  void validate(const model::ModelSpec& spec) const;
  nlohmann::json to_json() const;
};

// --master-weights: "fp32" or "bf16"; throws std::invalid_argument naming the flag otherwise.
DType parse_master_weights(std::string_view name);

}  // namespace zo::train
