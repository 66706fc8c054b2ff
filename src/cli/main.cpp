// offload_train: the one binary users run. Subcommands: train, plan, export, eval, sample,
// tokenize, info.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>

#include "comm/comm.h"
#include "common_options.h"
#include "core/error.h"
#include "data/token_source.h"
#include "eval_command.h"
#include "plan_command.h"
#include "sample_command.h"
#include "tokenize_command.h"
#include "train/config.h"
#include "train/export.h"
#include "train/resume_config.h"
#include "train/stop_request.h"
#include "train/trainer.h"
#include "usage_errors.h"

#ifndef ZO_VERSION
#define ZO_VERSION "0.1.0"
#endif

namespace {

std::string presets_help() {
  std::string s = "model preset (";
  const auto names = zo::model::preset_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    s += (i ? ", " : "") + names[i];
  return s + "), a JSON spec with GPT-2 keys, or a Hugging Face config.json";
}

using zo::cli::ByteSize;

// train's flags that are parsed after CLI11 has read them.
struct TrainTexts {
  std::string decay = "cosine", state_dtype = "fp32", master = "fp32";
  ByteSize devmem, hostmem, bucket;
};

void add_train_options(CLI::App* t, zo::train::TrainConfig& c, TrainTexts& x) {
  t->add_option("--model", c.model,
                presets_help() +
                    "; default tiny, the checkpoint's with --resume, or the config.json beside "
                    "--init-from's weights");
  t->add_option("--init-from", c.init_from,
                "start from Hugging Face weights: a .safetensors file, a "
                "model.safetensors.index.json, or a directory holding either");
  t->add_option("--seed", c.seed, "seed for initialisation and data order")->capture_default_str();
  t->add_flag("--recompute", c.recompute,
              "recompute each block's activations in backward (saves memory)");
  t->add_option("--data", c.data,
                "token shards (file, directory, glob), text files, or 'synthetic'")
      ->capture_default_str();
  t->add_option("--data-format", c.data_format, "auto, shards, text or synthetic")
      ->capture_default_str();
  t->add_option("--val-data", c.val_data,
                "separate validation data (default: hold out --val-fraction)");
  t->add_option("--val-fraction", c.val_fraction, "tail of each document held out for validation")
      ->capture_default_str();
  t->add_option("--micro-batch,-b", c.micro_batch, "sequences per micro-batch (B)")
      ->capture_default_str();
  t->add_option("--seq-len", c.seq_len, "tokens per sequence (T); default the model's block_size");
  t->add_option("--grad-accum", c.grad_accum, "micro-batches per optimizer step")
      ->capture_default_str();
  t->add_option("--steps", c.steps, "optimizer steps")->capture_default_str();
  t->add_option("--lr", c.lr.max_lr, "peak learning rate")->capture_default_str();
  t->add_option("--min-lr-fraction", c.lr.min_lr_fraction, "final lr as a fraction of --lr")
      ->capture_default_str();
  t->add_option("--warmup", c.lr.warmup_steps, "linear warmup steps")->capture_default_str();
  t->add_option("--lr-schedule-steps", c.lr.total_steps,
                "steps the lr schedule spans (default: --steps; a resumed run keeps its own)");
  t->add_option("--lr-decay", x.decay, "cosine, linear or constant")->capture_default_str();
  t->add_option("--beta1", c.beta1, "Adam beta1")->capture_default_str();
  t->add_option("--beta2", c.beta2, "Adam beta2")->capture_default_str();
  t->add_option("--adam-eps", c.eps, "Adam epsilon")->capture_default_str();
  t->add_option("--weight-decay", c.weight_decay, "AdamW decoupled weight decay (matrices only)")
      ->capture_default_str();
  t->add_flag("--decay-embeddings", c.decay_embeddings, "apply weight decay to embeddings too");
  t->add_flag("--decay-biases-and-norms", c.decay_biases_and_norms,
              "apply weight decay to biases and LayerNorm parameters too");
  t->add_option("--grad-clip", c.grad_clip, "global-norm gradient clipping; 0 = off")
      ->capture_default_str();
  t->add_option("--max-nonfinite-steps", c.max_nonfinite_steps,
                "stop after this many consecutive steps with Inf/NaN gradients; 0 = never")
      ->capture_default_str();
  t->add_option("--optimizer-state", x.state_dtype,
                "Adam m and v: fp32, bf16 or q8 (8-bit block-wise, 1 byte each)")
      ->capture_default_str();
  t->add_option(
       "--master-weights", x.master,
       "master weights on the host: fp32, or bf16 rounded stochastically (offload, stream)")
      ->capture_default_str();
  t->add_option("--state-dir", c.state_dir,
                "offload/stream: keep master weights, m and v in an unnamed file in DIR (a fast "
                "drive) instead of host memory, paged through a few staging chunks");
  t->add_option("--state-chunk", c.state_chunk_elements,
                "--state-dir: elements per chunk of the state file (whole q8 blocks of 2048); "
                "a staging slot holds one")
      ->capture_default_str();
  t->add_option("--adam-threads", c.adam_threads,
                "CPU Adam threads; 0 = all cores (this rank's share with mpirun), less two "
                "with a GPU");
  zo::cli::add_device_options(t, c.device, c.precision);
  t->add_option("--mode", c.mode,
                "resident (optimizer state on the device), offload (on the host, CPU Adam), "
                "stream (offload with a window of blocks on the device) or auto (resident when "
                "it fits on a GPU, else offload, else stream)")
      ->capture_default_str();
  t->add_option("--param-window", c.param_window,
                "stream: blocks on the device at a time, >= 2; 0 = 3 (2 for a 2-block model)")
      ->capture_default_str();
  t->add_option("--grad-accum-on", c.grad_accum_on,
                "offload, --grad-accum > 1: sum micro-batches in fp32 on the device (one bucket "
                "per step to the host), on the host, or auto (the device when it fits)")
      ->capture_default_str();
  t->add_flag_callback(
      "--no-cuda-graphs", [&c] { c.cuda_graphs = false; },
      "cuda, resident: launch forward and backward kernel by kernel instead of "
      "replaying CUDA Graph recordings");
  t->add_option("--loss-scale", c.loss_scale,
                "auto (dynamic for fp16, else off), dynamic, off, or a fixed scale")
      ->capture_default_str();
  t->add_option("--loss-scale-window", c.loss_scale_window,
                "overflow-free steps before a dynamic scale doubles")
      ->capture_default_str();
  t->add_option("--loss-scale-backoff", c.loss_scale_backoff, "dynamic scale factor on overflow")
      ->capture_default_str();
  t->add_option("--loss-scale-min", c.loss_scale_min, "smallest dynamic scale")
      ->capture_default_str();
  t->add_option("--loss-scale-max", c.loss_scale_max, "largest dynamic scale")
      ->capture_default_str();
  zo::cli::add_size_option(
      t, "--device-memory", x.devmem,
      "device memory to plan for and use, e.g. 24GiB (default: what is free less "
      "max(512MiB, 2%) for NCCL and scratch; unlimited on the host backend)");
  zo::cli::add_size_option(
      t, "--host-memory", x.hostmem,
      "host memory to plan for, e.g. 64GiB (default: what is available, this rank's "
      "share with mpirun)");
  zo::cli::add_size_option(t, "--bucket-size", x.bucket,
                           "offload: gradient bytes per bucket (default 32MiB)");
  t->add_flag("--dpu", c.dpu,
              "offload: delayed parameter update (the CPU update overlaps the next step)");
  t->add_option("--dpu-warmup", c.dpu_warmup, "ordinary steps before --dpu starts")
      ->capture_default_str();
  t->add_flag_callback(
      "--no-pin", [&c] { c.pin = false; }, "offload: pageable instead of page-locked host buffers");
  t->add_option("--trace", c.trace,
                "write a Chrome trace-event JSON of the run (Perfetto); an existing file is kept "
                "unless --overwrite (a resumed run replaces its own)");
  t->add_option("--threads", c.threads,
                "host backend compute threads; 0 = all cores (this rank's share)");
  t->add_option("--comm-timeout", c.comm_timeout,
                "data parallel: seconds a collective waits for the other ranks")
      ->capture_default_str();
  t->add_option("--eval-every", c.eval_interval, "validation every N steps; 0 = at the end only");
  t->add_option("--eval-batches", c.eval_batches, "micro-batches per validation")
      ->capture_default_str();
  t->add_option("--checkpoint-dir", c.checkpoint_dir, "where step_<N> checkpoint directories go");
  t->add_option("--checkpoint-every", c.checkpoint_interval,
                "checkpoint every N steps; 0 = at the end only");
  t->add_option("--keep", c.keep_last, "this run's checkpoints to keep; 0 = all")
      ->capture_default_str();
  t->add_flag("--overwrite", c.overwrite,
              "start even where another run's checkpoints, metrics or trace file exist "
              "(same-numbered checkpoints and those files are replaced)");
  t->add_option("--resume", c.resume, "checkpoint directory to continue from, or 'latest'");
  t->add_flag("--convert-optimizer-state", c.convert_optimizer_state,
              "resume a checkpoint whose Adam state or master weights are in another "
              "--optimizer-state or --master-weights format, converting them");
  t->add_option("--metrics", c.metrics, "JSONL file: one object per step");
  t->add_option("--log-every", c.log_interval, "progress line every N steps")
      ->capture_default_str();
  t->add_flag("--quiet,-q", c.quiet, "no progress output");
}

// The job is broken (a rank died, hangs or diverged): say why, then end every rank now rather
// than let the others wait in collectives or MPI_Finalize. Returns the exit status for a single
// process (no MPI job to abort).
int end_broken_job(const zo::CommError& e) {
  std::fprintf(stderr, "offload_train: error: %s\n", e.what());
  std::fflush(stderr);
  zo::comm::abort_job(1);
  return 1;
}

int run_train(zo::train::TrainConfig c, const TrainTexts& x, const CLI::App& cmd) {
  for (const std::string& key : zo::train::restored_keys()) {
    if (cmd.count(zo::train::flag_of(key)) > 0) c.explicit_keys.insert(key);
  }
  c.lr.decay = zo::train::parse_decay(x.decay);
  if (cmd.count("--lr-schedule-steps") == 0) c.lr.total_steps = c.steps;
  c.optimizer_state = zo::parse_state_format(x.state_dtype);
  c.master_weights = zo::train::parse_master_weights(x.master);
  c.device_memory = x.devmem.bytes();
  c.host_memory = x.hostmem.bytes();
  if (x.bucket.given()) c.bucket_size = x.bucket.bytes();
  if (cmd.count("--model") == 0) c.model.clear();  // resume takes the checkpoint's spec
  zo::train::install_stop_signals();
  zo::train::Trainer trainer(c);
  zo::train::TrainSummary summary;
  try {
    summary = trainer.run([](const std::string& line) { std::cerr << line << std::endl; });
  } catch (const zo::CommError& e) {
    // Here, not in main: tearing the trainer down would wait for collectives that cannot
    // complete.
    return end_broken_job(e);
  }
  if (!summary.stopped.empty() && trainer.rank() == 0) {
    std::fprintf(stderr, "offload_train: %s%s\n", summary.exit_status == 1 ? "error: " : "",
                 summary.stopped.c_str());
  }
  return summary.exit_status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "offload_train " ZO_VERSION
      ": train GPT-style models whose training state does not fit in GPU memory\n"
      "(ZeRO-Offload: 16-bit forward/backward on the GPU, Adam on the CPU over fp32, bf16\n"
      "or 8-bit state)."};
  app.set_version_flag("--version", ZO_VERSION);
  app.require_subcommand(1);

  // train
  zo::train::TrainConfig tc;
  TrainTexts texts;
  auto* train = app.add_subcommand("train", "Train a GPT-2 or Llama-family model");
  add_train_options(train, tc, texts);

  // plan
  zo::cli::PlanCommand pln;
  zo::cli::add_plan_command(app, pln, presets_help());

  // export
  auto* exp = app.add_subcommand("export",
                                 "Write a checkpoint's weights as Hugging Face safetensors: one "
                                 "file, or a model directory");
  zo::train::ExportConfig ec;
  std::string exp_dtype = "fp32";
  exp->add_option("--checkpoint", ec.checkpoint,
                  "checkpoint directory, or 'latest' with --checkpoint-dir")
      ->required();
  exp->add_option("--checkpoint-dir", ec.checkpoint_dir, "where to look for 'latest'");
  exp->add_option("--out,-o", ec.out,
                  "FILE.safetensors: one file; any other path: a Hugging Face model directory "
                  "(config.json, model.safetensors or shards and their index)")
      ->required();
  exp->add_option("--dtype", exp_dtype, "fp32, fp16 or bf16")->capture_default_str();
  exp->add_option("--shard-size", ec.shard_size,
                  "directory output: most tensor bytes per shard, e.g. 2GB (default 5GB)");
  exp->add_flag("--allow-nonfinite", ec.allow_nonfinite,
                "write weights that are NaN or Inf (or overflow --dtype fp16) instead of refusing");
  exp->add_flag("--force", ec.force,
                "overwrite an existing output file, or write into a non-empty directory");

  // eval
  zo::cli::EvalCommand evl;
  zo::cli::add_eval_command(app, evl, presets_help());

  // sample
  zo::cli::SampleCommand smp;
  zo::cli::add_sample_command(app, smp, presets_help());

  // tokenize
  zo::cli::TokenizeCommand tok;
  zo::cli::add_tokenize_command(app, tok);

  // info
  auto* info = app.add_subcommand("info",
                                  "Show what this machine offers: CPU Adam ISA paths, "
                                  "threads, host memory, NUMA nodes, GPUs, and the host bytes per "
                                  "parameter of each optimizer format");
  bool info_json = false;
  std::string info_state_dir;
  info->add_flag("--json", info_json, "print as one JSON object");
  info->add_option("--state-dir", info_state_dir,
                   "also measure the drive holding DIR for --state-dir: a 1 GiB file written "
                   "and read back, O_DIRECT (nothing is left there)");

  if (argc > 1 && argv[1][0] != '-') {
    if (const std::string m = zo::cli::unknown_subcommand(app, argv[1]); !m.empty()) {
      std::fprintf(stderr, "offload_train: error: %s\n", m.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
    zo::cli::check_option_values(app);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every command-line mistake exits 2.
    return zo::cli::report_usage_error(app, e);
  }
  try {
    if (train->parsed()) {
      return run_train(tc, texts, *train);
    }
    if (pln.app->parsed()) return zo::cli::run_plan(pln);
    if (exp->parsed()) {
      ec.dtype = zo::parse_dtype(exp_dtype);
      std::fprintf(stderr, "%s\n", zo::train::export_checkpoint(ec).c_str());
      return 0;
    }
    if (tok.app->parsed()) return zo::cli::run_tokenize(tok);
    if (evl.app->parsed()) return zo::cli::run_eval(evl);
    if (smp.app->parsed()) return zo::cli::run_sample(smp);
    if (info->parsed()) return zo::cli::run_info(info_json, info_state_dir);
  } catch (const zo::CommError& e) {
    return end_broken_job(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
