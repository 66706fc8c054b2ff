#include "train/config.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace zo::train {

void TrainConfig::validate_flags() const {
  auto bad = [](const std::string& m) { throw std::invalid_argument(m); };
  if (!resume.empty() && !init_from.empty()) {
    bad("--resume and --init-from conflict: a resumed run takes its weights from the checkpoint");
  }
  if (resume == "latest" && checkpoint_dir.empty()) {
    bad("--resume latest needs --checkpoint-dir to look in");
  }
  if (checkpoint_interval > 0 && checkpoint_dir.empty()) {
    bad("--checkpoint-every needs --checkpoint-dir");
  }
  if (state_chunk_elements < 2048 || state_chunk_elements > (std::size_t{1} << 30) ||
      state_chunk_elements % 2048 != 0) {
    bad("--state-chunk must be a multiple of 2048 (whole q8 blocks) from 2048 to 1073741824 "
        "elements (default 4194304)");
  }
  // Beyond any machine: TBB ignores the excess, and an arena asked for 2^24 threads crashed.
  for (const auto& [flag, n] :
       {std::pair{"--threads", threads}, {"--adam-threads", adam_threads}}) {
    if (n < 0 || n > kMaxThreads) {
      bad(std::string(flag) + " must be 0 (all cores) to " + std::to_string(kMaxThreads));
    }
  }
  if (state_dir.empty() && state_chunk_elements != optim::kDefaultChunkElements) {
    bad("--state-chunk sizes the chunks of the --state-dir file; add --state-dir DIR or drop "
        "--state-chunk");
  }
  if (!state_dir.empty() && mode == "resident") {
    bad("--state-dir keeps the optimizer state on a drive for the CPU update; resident mode "
        "keeps it on the device: use --mode offload or stream");
  }
  // The numbers, before anything uses them (the data-parallel timeout is the first); each
  // comparison is written so that NaN fails it.
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) bad("--val-fraction must be in [0, 1)");
  for (auto [name, b] : {std::pair{"--beta1", beta1}, {"--beta2", beta2}}) {
    if (!(b >= 0.0f && b < 1.0f)) bad(std::string(name) + " must be in [0, 1)");
  }
  if (!(eps > 0.0f) || !std::isfinite(eps)) bad("--adam-eps must be finite and > 0 (1e-8)");
  if (!(weight_decay >= 0.0f) || !std::isfinite(weight_decay)) {
    bad("--weight-decay must be finite and >= 0 (0.1)");
  }
  if (!(grad_clip >= 0.0f) || !std::isfinite(grad_clip)) bad("--grad-clip must be >= 0 (0 = off)");
  if (!(loss_scale_backoff > 0.0f && loss_scale_backoff < 1.0f)) {
    bad("--loss-scale-backoff must be in (0, 1) (default 0.5)");
  }
  if (!(loss_scale_min > 0.0f && loss_scale_min <= loss_scale_max &&
        std::isfinite(loss_scale_max))) {
    bad("need 0 < --loss-scale-min <= --loss-scale-max (finite); defaults 1 and 16777216");
  }
  // Beyond a million seconds (11.6 days) a timeout is a mistake, and infinity overflows the
  // deadline arithmetic.
  if (!(comm_timeout > 0.0 && comm_timeout <= 1e6)) {
    bad("--comm-timeout must be in (0, 1e6] seconds (300)");
  }
}

void TrainConfig::validate(const model::ModelSpec& spec) const {
  validate_flags();
  auto bad = [](const std::string& m) { throw std::invalid_argument(m); };
  // Upper bounds far above useful values keep every size product exact and every buffer sized by
  // them small.
  if (micro_batch < 1 || micro_batch > kMaxMicroBatch) {
    bad("--micro-batch must be in 1.." + std::to_string(kMaxMicroBatch));
  }
  if (grad_accum < 1 || grad_accum > kMaxGradAccum) {
    bad("--grad-accum must be in 1.." + std::to_string(kMaxGradAccum));
  }
  if (steps < 1 || steps > kMaxSteps) bad("--steps must be in 1.." + std::to_string(kMaxSteps));
  if (seq_len < 0) {  // 0: not given, the block size (as eval's --seq-len 0)
    bad("--seq-len " + std::to_string(seq_len) + " must be >= 1 (or 0 for the model's block_size " +
        std::to_string(spec.block_size) + ")");
  }
  if (seq_len > spec.block_size) {
    bad("--seq-len " + std::to_string(seq_len) + " exceeds the model's block_size " +
        std::to_string(spec.block_size) + "; use --seq-len <= block_size or a larger model spec");
  }
  lr.validate();
  if (device != "auto" && device != "host" && device != "cuda") {
    bad("--device must be auto, host or cuda");
  }
  if (mode != "auto" && mode != "resident" && mode != "offload" && mode != "stream") {
    bad("--mode must be auto, resident, offload or stream");
  }
  if (param_window != 0 && mode != "stream") {
    bad("--param-window is the window of --mode stream; add --mode stream or drop it");
  }
  if (mode == "stream") {
    if (param_window != 0 && (param_window < 2 || param_window > spec.n_layer)) {
      bad("--param-window must be in 2.." + std::to_string(spec.n_layer) + " (the model's blocks)");
    }
    if (spec.n_layer < 2) {
      bad("--mode stream passes the blocks through a window of at least 2; this model has " +
          std::to_string(spec.n_layer) + " block: use --mode offload");
    }
    if (dpu) {
      bad("--dpu is not available in --mode stream: the next step would read a block while CPU "
          "Adam writes its new values into the same host copy; drop --dpu or use --mode offload");
    }
    if (grad_accum_on == "device") {
      bad("--grad-accum-on device needs an fp32 gradient of every parameter on the device, which "
          "stream mode does not hold; use --grad-accum-on host or auto");
    }
  }
  if (grad_accum_on != "auto" && grad_accum_on != "device" && grad_accum_on != "host") {
    bad("--grad-accum-on must be auto, device or host");
  }
  if (mode == "resident" && grad_accum_on == "host") {
    bad("--grad-accum-on host is for --mode offload; resident mode sums micro-batches on the "
        "device");
  }
  if (precision != "auto" && precision != "fp32" && precision != "bf16" && precision != "fp16") {
    bad("--precision must be auto, fp32, bf16 or fp16");
  }
  if (loss_scale_window < 1) bad("--loss-scale-window must be >= 1");
  if (mode == "resident" && optimizer_state != StateFormat::kF32) {
    bad("--optimizer-state " + std::string(state_format_name(optimizer_state)) +
        " is for --mode offload or stream (host memory); resident mode keeps fp32 state on the "
        "device");
  }
  if (mode == "resident" && master_weights != DType::kF32) {
    bad("--master-weights bf16 is for --mode offload or stream (host memory); resident mode keeps "
        "fp32 master weights on the device");
  }
  if (master_weights != DType::kF32 && master_weights != DType::kBF16) {
    bad("--master-weights must be fp32 or bf16");
  }
  if (eval_interval < 0 || eval_batches < 1 || eval_batches > kMaxEvalBatches) {
    bad("--eval-every must be >= 0 and --eval-batches in 1.." + std::to_string(kMaxEvalBatches));
  }
  if (checkpoint_interval < 0 || keep_last < 0) bad("--checkpoint-every and --keep must be >= 0");
  if (max_nonfinite_steps < 0) bad("--max-nonfinite-steps must be >= 0 (0 = never stop)");
  if (log_interval < 1) bad("--log-every must be >= 1");
  if (bucket_size < 4096) bad("--bucket-size must be at least 4KiB (default 32MiB)");
  if (dpu_warmup < 0) bad("--dpu-warmup must be >= 0");
  if (dpu && mode == "resident") {
    bad("--dpu delays the CPU update of offload mode; drop it or use --mode offload");
  }
}

nlohmann::json TrainConfig::to_json() const {
  return {{"model", model},
          {"init_from", init_from},
          {"seed", seed},
          {"recompute", recompute},
          {"data", data},
          {"data_format", data_format},
          {"val_data", val_data},
          {"val_fraction", val_fraction},
          {"micro_batch", micro_batch},
          {"seq_len", seq_len},
          {"grad_accum", grad_accum},
          {"steps", steps},
          {"lr", lr.max_lr},
          {"min_lr_fraction", lr.min_lr_fraction},
          {"warmup", lr.warmup_steps},
          {"lr_decay", decay_name(lr.decay)},
          {"lr_schedule_steps", lr.total_steps},
          {"beta1", beta1},
          {"beta2", beta2},
          {"adam_eps", eps},
          {"weight_decay", weight_decay},
          {"decay_embeddings", decay_embeddings},
          {"decay_biases_and_norms", decay_biases_and_norms},
          {"grad_clip", grad_clip},
          {"optimizer_state", state_format_name(optimizer_state)},
          {"master_weights", dtype_name(master_weights)},
          {"device", device},
          {"mode", mode},
          {"param_window", param_window},
          {"grad_accum_on", grad_accum_on},
          {"precision", precision},
          {"loss_scale", loss_scale},
          {"loss_scale_window", loss_scale_window},
          {"loss_scale_backoff", loss_scale_backoff},
          {"loss_scale_min", loss_scale_min},
          {"loss_scale_max", loss_scale_max},
          {"device_memory", device_memory},
          {"host_memory", host_memory},
          {"bucket_size", bucket_size},
          {"dpu", dpu},
          {"dpu_warmup", dpu_warmup},
          {"comm_timeout", comm_timeout},
          {"pin", pin},
          {"eval_interval", eval_interval},
          {"eval_batches", eval_batches},
          {"checkpoint_dir", checkpoint_dir},
          {"checkpoint_interval", checkpoint_interval},
          {"keep_last", keep_last},
          {"max_nonfinite_steps", max_nonfinite_steps}};
}

DType parse_master_weights(std::string_view name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  throw std::invalid_argument("--master-weights must be fp32 or bf16 (got '" + std::string(name) +
                              "')");
}

}  // namespace zo::train
