#include "train/session.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>

#include <oneapi/tbb/info.h>

#include "checkpoint/atomic_io.h"
#include "comm/comm.h"
#include "core/bytes.h"
#include "core/error.h"
#include "cpu_adam/cpu_adam.h"
#include "data/token_source.h"
#include "device/make_device.h"
#include "model/hf_weights.h"
#include "offload/engine_config.h"
#include "optim/state_pager.h"
#include "pinned_memory/host_buffer.h"
#include "pinned_memory/pinned_buffer.h"
#include "train/checkpoint_io.h"
#include "train/evaluate.h"
#include "train/plan.h"
#include "train/resume_config.h"
#include "train/run_outputs.h"

namespace zo::train {
namespace {

LossScalerConfig scaler_config(const TrainConfig& c, DType act) {
  LossScalerConfig s;
  s.growth_interval = c.loss_scale_window;
  s.backoff = c.loss_scale_backoff;
  s.min_scale = c.loss_scale_min;
  s.max_scale = c.loss_scale_max;
  if (c.loss_scale == "auto") {
    s.dynamic = act == DType::kF16;
    if (!s.dynamic) s.initial = 1.0f;
  } else if (c.loss_scale == "dynamic") {
    s.dynamic = true;
  } else if (c.loss_scale == "off") {
    s.dynamic = false;
    s.initial = 1.0f;
  } else {
    s.dynamic = false;
    try {
      std::size_t pos = 0;
      s.initial = std::stof(c.loss_scale, &pos);
      if (pos != c.loss_scale.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw std::invalid_argument("--loss-scale '" + c.loss_scale +
                                  "': use auto, dynamic, off or a positive number");
    }
  }
  return s;
}

// A trace per rank: rank 0 writes the given path, rank r <stem>.rank<r><ext>.
std::string trace_path(const std::string& path, int rank) {
  if (path.empty() || rank == 0) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() /
          (p.stem().string() + ".rank" + std::to_string(rank) + p.extension().string()))
      .string();
}

}  // namespace

Session::Session(const TrainConfig& c) : cfg(c) {
  cfg.validate_flags();
  // Test hook (docs/testing.md): an error mid-step, for the binary
  // (TrainConfig::inject_error_step).
  if (const char* s = std::getenv("ZO_TEST_ERROR_STEP")) cfg.inject_error_step = std::atoll(s);
  join_job();
  resolve_model();
  // A finished run resumed again (a scheduler's restart, say): nothing is opened or changed.
  if (resume_state && cfg.steps <= start_step) {
    check_checkpoint_model(resume_dir, *resume_state, spec);  // a wrong --model is still wrong
    finished = true;
    return;
  }
  check_outputs();
  open_device_and_plan();  // before the data: a spec too large for memory costs nothing more
  open_data();
  make_optimizer_state();  // (its file, with --state-dir, may share the checkpoints' drive)
  if (!cfg.checkpoint_dir.empty()) {  // rank 0 checks its drive; every rank learns the outcome
    std::string failure;
    if (rank == 0) {
      try {
        check_checkpoint_space();
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    if (ranks > 1) failure = comm::broadcast_string(*comm, failure, 0);
    if (!failure.empty()) throw CheckpointError(rank == 0 ? failure : "rank 0: " + failure);
  }
  make_updater_and_model();
  init_weights();
  updater->load_state();
  claim_outputs();
}

// Data parallel when started by mpirun (or ZO_WORLD_SIZE > 1): every rank must run the same
// configuration, checked before anything is opened.
void Session::join_job() {
  comm = comm::make_comm_from_env(cfg.comm_timeout);
  ranks = comm->size();
  rank = comm->rank();
  local_ranks = std::max(1, comm::rank_info_from_env().local_size);
  if (ranks > 1) {
    if (const char* s = std::getenv("ZO_TEST_STALL")) {
      int r = -1;
      long long st = 0;
      if (std::sscanf(s, "%d:%lld", &r, &st) == 2 && r == rank && st >= 1) stall_step = st;
    }
    comm::check_same_on_all_ranks(*comm, "the training flags", cfg.to_json().dump());
    if (cfg.mode == "resident") {
      throw std::invalid_argument(
          "--mode resident: a data-parallel job keeps the optimizer state partitioned on the "
          "ranks' hosts (ZeRO-2 with offload); use --mode offload or auto");
    }
  }
}

// A checkpoint's optimizer state and master weights are resumed in their own formats unless a
// conversion is asked for: q8 read as fp32 (or the reverse) would silently change what the run
// trains with.
void Session::check_state_format() {
  struct Format {
    const char *key, *config_key, *flag, *what;
    std::string wanted;
  };
  const Format formats[] = {
      {"optimizer_state_dtype", "optimizer_state", "--optimizer-state", "optimizer state",
       std::string(state_format_name(cfg.optimizer_state))},
      {"master_weights_dtype", "master_weights", "--master-weights", "master weights",
       std::string(dtype_name(cfg.master_weights))}};
  for (const Format& f : formats) {
    const std::string saved = resume_state->value(f.key, std::string("fp32"));
    if (saved == f.wanted) continue;
    if (!cfg.explicit_keys.contains(f.config_key)) {  // the run's own settings disagree
      throw CheckpointError("checkpoint '" + resume_dir.string() + "': trainer_state.json says " +
                            f.key + " " + saved + " but its config says " + f.config_key + " " +
                            f.wanted +
                            "; the file was changed after the save. Resume from an "
                            "earlier checkpoint");
    }
    if (!cfg.convert_optimizer_state) {
      throw std::invalid_argument("checkpoint '" + resume_dir.string() + "' holds " + saved + " " +
                                  f.what + ", but this run asks for " + f.flag + " " + f.wanted +
                                  ": pass --convert-optimizer-state to convert them, "
                                  "or drop " +
                                  f.flag + " to keep " + saved);
    }
    notes.push_back("converted the checkpoint's " + saved + " " + f.what + " to " + f.wanted);
  }
}

// The model: from the checkpoint when resuming without --model.
void Session::resolve_model() {
  if (!cfg.resume.empty()) {
    resume_dir = resolve_checkpoint(cfg.resume, cfg.checkpoint_dir);
    resume_state = read_trainer_state(resume_dir);
    for (const std::string& o : restore_run_settings(cfg, resume_state->at("config")))
      notes.push_back("resumed with " + o);
    check_state_format();
    run_id = resume_state->value("run_id", std::string());
    start_step = resume_state->at("step").get<std::int64_t>();
    if (cfg.checkpoint_dir.empty())
      notes.push_back(
          "no --checkpoint-dir: this resumed run saves no checkpoints (give one, "
          "e.g. the folder of " +
          resume_dir.string() + ", to keep saving)");
  } else {
    run_id = comm::broadcast_string(*comm, rank == 0 ? new_run_id() : std::string(), 0);
  }
  if (cfg.model.empty() && !resume_state && !cfg.init_from.empty()) {
    const std::string config = init_from_config(cfg.init_from);
    spec = model::load_model_spec(config);
    notes.push_back("model from " + config + " (beside --init-from)");
  } else if (cfg.model.empty()) {
    spec = resume_state ? checkpoint_spec(*resume_state) : model::load_model_spec("tiny");
  } else {
    spec = model::load_model_spec(cfg.model);
  }
  try {
    cfg.validate(spec);
  } catch (const std::invalid_argument& e) {
    if (!resume_state) throw;
    throw std::invalid_argument(std::string(e.what()) + " (a resumed run takes every setting " +
                                "not given again, and its model, from " + resume_dir.string() +
                                "/trainer_state.json)");
  }
  T = cfg.seq_len > 0 ? cfg.seq_len : spec.block_size;
  if (cfg.steps > cfg.lr.total_steps) {
    char lr[32];
    std::snprintf(lr, sizeof lr, "%.3g", double(cfg.lr.at(cfg.lr.total_steps)));
    notes.push_back("the lr schedule spans " + std::to_string(cfg.lr.total_steps) +
                    " steps: steps " + std::to_string(cfg.lr.total_steps + 1) + ".." +
                    std::to_string(cfg.steps) + " run at its final lr " + lr +
                    " (--lr-schedule-steps plans a longer one)");
  }
  layout = std::make_unique<model::ParameterLayout>(spec);
}

// Where the run writes, checked before anything large happens (rank 0 checks what rank 0 writes,
// and every rank learns the outcome): the checkpoint directory (made, writable, holding no other
// run's checkpoints unless --overwrite), the metrics file, and this rank's trace file.
void Session::check_outputs() {
  const auto start = std::uint64_t(start_step);  // 0: a fresh run
  std::string failure;
  if (rank == 0) {
    try {
      refuse_shared_outputs({{"--checkpoint-dir", cfg.checkpoint_dir},
                             {"--metrics", cfg.metrics},
                             {"--trace", cfg.trace}});
      if (!cfg.checkpoint_dir.empty()) {
        check_checkpoint_dir_path(cfg.checkpoint_dir);
        checkpoint_lock = DirLock(cfg.checkpoint_dir, "--checkpoint-dir");
        if (!checkpoint_lock.note().empty()) notes.push_back(checkpoint_lock.note());
        checkpoint_claim = check_checkpoint_dir(cfg.checkpoint_dir, run_id, start, cfg.overwrite);
        notes.insert(notes.end(), checkpoint_claim.notes.begin(), checkpoint_claim.notes.end());
      }
      // A resumed run appends to its metrics; a fresh one would replace the file.
      if (!cfg.metrics.empty()) {
        check_output_file(cfg.metrics, "--metrics", !resume_state, cfg.overwrite);
        if (resume_state) {
          metrics_foreign = metrics_not_continuable(cfg.metrics, run_id);
          if (!metrics_foreign.empty() && !cfg.overwrite) {
            throw CheckpointError("--metrics '" + cfg.metrics + "' is not this run's metrics (" +
                                  metrics_foreign +
                                  "), so the resumed run cannot continue it; choose another "
                                  "path (or pass --overwrite to start that file anew)");
          }
        }
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (ranks > 1) failure = comm::broadcast_string(*comm, failure, 0);
  if (!failure.empty()) {
    throw CheckpointError(rank == 0 ? failure : "rank 0: " + failure);
  }
  if (cfg.trace.empty()) return;
  // Every rank checks its own trace file (a resumed run replaces its own: the file names the
  // run; any other is kept), and every rank learns whether one was refused.
  std::string refused;
  try {
    const std::string path = trace_path(cfg.trace, rank);
    check_output_file(path, "--trace", !(resume_state && report::trace_of_run(path, run_id)),
                      cfg.overwrite);
  } catch (const std::exception& e) {
    refused = e.what();
  }
  double any = refused.empty() ? 0.0 : 1.0;
  if (ranks > 1) comm->all_reduce(&any, 1, comm::ReduceOp::kSum);
  if (!refused.empty()) throw CheckpointError(refused);
  if (any > 0.0)
    throw CheckpointError("another rank's --trace file was refused (its message says why)");
}

// The drive under --checkpoint-dir holds at least one checkpoint (refused before the first step
// rather than at the first save), and is said to be short when it cannot hold what this run keeps
// at once: its --keep saves and the one being written.
void Session::check_checkpoint_space() {
  const auto start = std::uint64_t(start_step);  // 0: a fresh run
  std::error_code ec;
  const std::filesystem::space_info space = std::filesystem::space(cfg.checkpoint_dir, ec);
  if (ec) return;  // no figure (some network file systems): the save reports a full drive
  const std::size_t one = checkpoint_file_bytes(*layout, cfg.master_weights, cfg.optimizer_state);
  const std::uint64_t steps = cfg.steps > std::int64_t(start) ? cfg.steps - start : 0;
  const std::uint64_t saves =
      (cfg.checkpoint_interval > 0 ? steps / std::uint64_t(cfg.checkpoint_interval) : 0) + 1;
  const std::uint64_t kept =
      cfg.keep_last > 0 ? std::min<std::uint64_t>(saves, std::uint64_t(cfg.keep_last) + 1) : saves;
  const std::string note =
      check_checkpoint_room(cfg.checkpoint_dir, space.available, one, kept, cfg.keep_last);
  if (!note.empty()) notes.push_back(note);
}

// The data, opened and validated before anything large is allocated.
void Session::open_data() {
  data::SourceConfig sc;
  sc.path = cfg.data;
  sc.format = data::parse_data_format(cfg.data_format);
  sc.vocab_size = spec.vocab_size;
  std::shared_ptr<const data::TokenSource> train_src = data::open_token_source(sc);
  std::shared_ptr<const data::TokenSource> val_src;
  if (!cfg.val_data.empty()) {
    sc.path = cfg.val_data;
    val_src = data::open_token_source(sc);
  }
  data::LoaderConfig lc;
  lc.batch_size = cfg.micro_batch;
  lc.seq_len = T;
  lc.seed = cfg.seed;
  lc.val_fraction = cfg.val_fraction;
  lc.rank = rank;  // rank r reads rows r, r + ranks, ... of the global batch
  lc.world_size = ranks;
  loaders = data::make_loaders(train_src, val_src, lc);
  if (ranks > 1) {  // same files (names, sizes) on every rank, e.g. on every node
    comm::check_same_on_all_ranks(*comm, "the training data",
                                  loaders.train->source().fingerprint().dump(),
                                  "give every rank the same data files (a path every rank sees, "
                                  "or identical copies)");
    if (resume_state) {
      comm::check_same_on_all_ranks(
          *comm, "the checkpoint to resume",
          resume_dir.string() + " step " + resume_state->at("step").dump(),
          "resume every rank from the same checkpoint directory, on a file system every rank "
          "sees");
    }
  }
}

// The device, and the memory plan of the mode it implies, checked before allocating.
void Session::open_device_and_plan() {
  dev::DeviceRequest r;
  r.device = cfg.device;
  r.precision = cfg.precision;
  r.capacity_bytes = cfg.device_memory;
  // Ranks sharing a machine share its cores: "all cores" means this rank's share.
  r.threads = cfg.threads == 0 ? core_share() : cfg.threads;
  r.gpu_ordinal = comm->local_rank();  // one GPU per rank on a machine
  // oneTBB runs at most one thread per CPU this process may use (its affinity mask and cgroup),
  // whatever an arena asks for.
  const int hw = tbb::info::default_concurrency();
  for (const auto& [flag, n] :
       {std::pair{"--threads", cfg.threads}, {"--adam-threads", cfg.adam_threads}}) {
    if (hw > 0 && n > hw) {
      notes.push_back(std::string(flag) + " " + std::to_string(n) + ": this process may use " +
                      std::to_string(hw) + " CPUs, so at most " + std::to_string(hw) + " run");
    }
  }
  dev = dev::make_device(r);
  // Ranks sharing a machine: run this one (and the Adam threads it creates) next to its GPU,
  // unless the launcher bound it already (mpirun --bind-to ...).
  if (ranks > 1) pinned::run_near_node(dev::numa_node_of(*dev));
  const DType act = dev->act_dtype();
  scaler = LossScaler(scaler_config(cfg, act));
  PlanInput pi{
      spec,
      {cfg.micro_batch, T, cfg.recompute},
      act,
      cfg.optimizer_state,
      dev->capacity_bytes(),
      // Ranks on one machine share its memory.
      cfg.host_memory ? cfg.host_memory : pinned::host_available_bytes() / std::size_t(local_ranks),
      false,
      engine_config(),
      parse_accum_placement(cfg.grad_accum_on)};
  pi.state_chunk_elements = cfg.state_chunk_elements;
  if (!cfg.trace.empty()) pi.trace_events = kTraceMaxEvents;
  pi.engine.param_window =
      offered_param_window(spec, cfg.mode, cfg.param_window, ranks, cfg.dpu, cfg.grad_accum_on);
  if (cfg.mode == "stream" && ranks > 1) {
    throw std::invalid_argument(
        "--mode stream runs one rank: data parallelism would need a per-group all-gather into "
        "the window; use --mode offload with mpirun");
  }
  // auto: resident on a GPU when everything fits there (and the state is fp32), else offload,
  // else stream when only the window fits the device.
  const ModeChoice choice = choose_mode(pi, dev->backend() == dev::Backend::kCuda);
  resident = cfg.mode == "auto" ? choice.choose_resident && ranks == 1 && cfg.state_dir.empty()
                                : cfg.mode == "resident";
  const bool streaming = cfg.mode == "stream" || (cfg.mode == "auto" && choice.choose_stream);
  param_window = streaming ? pi.engine.param_window : 0;
  pi.resident = resident;
  pi.engine.param_window = param_window;
  // Each rank decides by its own device: the collectives are the same either way.
  accumulate_on_device = !resident && !streaming && choice.offload_engine.accumulate_on_device;
  const MemoryPlan& plan = resident ? choice.resident : streaming ? choice.stream : choice.offload;
  if (cfg.mode == "auto" && streaming)
    notes.push_back("--mode auto: stream (" + choice.reason + ")");
  if (!plan.device_fits || !plan.host_fits) {
    throw std::runtime_error("this run does not fit in memory:\n" + plan.format(pi));
  }
  restore_gemm_choices();
}

// The checkpointed run's timed GEMM algorithms, so that the resumed steps compute its bits.
void Session::restore_gemm_choices() {
  if (!resume_state || !resume_state->contains("gemm_choices")) return;
  if (dev->backend() != dev::Backend::kCuda) return;  // one algorithm per GEMM there
  const std::string& text = resume_state->at("gemm_choices").get_ref<const std::string&>();
  // The manifest's checksums guard the text; one this version cannot read costs bits, not the run.
  std::string why;
  try {
    why = dev->restore_gemm_choices(text);
  } catch (const std::invalid_argument& e) {
    why = e.what();
  }
  if (why.empty()) {
    notes.push_back("GEMM algorithms: the checkpointed run's timed choices");
  } else {
    notes.push_back("GEMM algorithms timed again, not the checkpoint's (" + why +
                    "): the resumed steps may differ from an uninterrupted run in the last bits");
  }
}

void Session::make_optimizer_state() {
  const DType act = dev->act_dtype();
  optim::OptimizerConfig oc;
  oc.adam.beta1 = cfg.beta1;
  oc.adam.beta2 = cfg.beta2;
  oc.adam.eps = cfg.eps;
  oc.adam.weight_decay = cfg.weight_decay;
  oc.adam.lr = cfg.lr.max_lr;
  oc.decay_policy.embeddings = cfg.decay_embeddings;
  oc.decay_policy.biases_and_norms = cfg.decay_biases_and_norms;
  oc.state_format = cfg.optimizer_state;
  oc.master_dtype = cfg.master_weights;
  oc.seed = cfg.seed;
  oc.state_dir = cfg.state_dir;
  oc.state_chunk_elements = cfg.state_chunk_elements;
  if (!resident && act == cfg.master_weights && cfg.state_dir.empty()) {
    // the engine uploads from the master itself
    const pinned::PinOptions staging = dev::staging_pin_options(*dev, cfg.pin);
    oc.master_pin.enable = staging.enable;
    oc.master_pin.locker = staging.locker;
  }
  oc.threads = cfg.adam_threads != 0 ? cfg.adam_threads : adam_threads_default();
  if (ranks > 1) {  // every rank's partition (checkpoints gather by them); this rank's own
    for (int r = 0; r < ranks; ++r) {
      offload::EngineConfig e = engine_config();
      e.rank = r;
      partitions.push_back(offload::engine_partition(*layout, act, e));
      if (partitions.back().empty()) {
        throw std::invalid_argument(std::to_string(ranks) + " ranks leave rank " +
                                    std::to_string(r) +
                                    " no parameters to own: use fewer ranks or a larger "
                                    "--bucket-size");
      }
    }
  }
  opt = std::make_unique<optim::HostOptimizer>(
      *layout, oc, ranks > 1 ? partitions[std::size_t(rank)] : std::vector<optim::OwnedRange>{});
  if (const optim::StatePager* p = opt->pager()) notes.push_back(p->describe());
  // Without AVX-512, q8's table lookups make its update compute-bound (docs/performance.md).
  const cpu_adam::Isa isa = cpu_adam::default_isa();
  if (!resident && cfg.optimizer_state == StateFormat::kQ8 && isa < cpu_adam::Isa::kAvx512) {
    notes.push_back("--optimizer-state q8 on CPU Adam's " + std::string(cpu_adam::isa_name(isa)) +
                    " path (no AVX-512): its update is no faster than fp32 state's (0.55-1.0x "
                    "with AVX2 on two Zen 3 cores); q8 saves host memory here, not time");
  }
}

void Session::make_updater_and_model() {
  if (!cfg.trace.empty())
    trace = report::Trace(trace_path(cfg.trace, rank), kTraceMaxEvents, run_id);
  if (optim::StatePager* pager = opt->pager(); pager && trace.enabled()) {
    // Each staging slot's reads and writes on its own track (one transfer at a time per slot),
    // and the update's waits for them on another.
    pager->observe([t = &trace](const optim::StatePager::Transfer& x) {
      try {
        t->span("drive slot " + std::to_string(x.slot),
                (x.write ? "write chunk " : "read chunk ") + std::to_string(x.chunk),
                t->to_us(x.submitted), t->to_us(x.completed), {{"bytes", x.bytes}});
        const double began = t->to_us(x.wait_began), ended = t->to_us(x.wait_ended);
        // Only where the transfer was not done as the wait began; under 10 us the wait is the
        // queue's bookkeeping, not the drive.
        if (x.completed > x.wait_began && ended - began > 10.0)
          t->span("drive waits", "wait for chunk " + std::to_string(x.chunk), began, ended);
      } catch (...) {  // a trace that cannot record loses the event, never the step
      }
    });
  }
  stream = dev->create_stream();
  updater = resident ? make_resident_updater(*dev, *stream, *layout, *opt, cfg.grad_accum)
                     : make_offload_updater(*dev, *stream, *layout, *opt, engine_config(), &trace,
                                            comm.get());
  model = model::make_model(*dev, *layout, model::ModelShape{cfg.micro_batch, T, cfg.recompute});
  model->use_graphs(cfg.cuda_graphs);
  if (cfg.cuda_graphs && resident && dev->can_capture()) {
    notes.push_back(
        "CUDA graphs: forward and backward recorded at the second step and replayed as one launch "
        "each (--no-cuda-graphs: kernel by kernel)");
  }
}

// Our own initial weights of the owned ranges: straight into an fp32 master in memory, through
// pieces of kImportPieceElements (counted in the plan) into a bf16 one or one on a drive.
void Session::init_master() {
  for (const optim::OwnedRange& o : opt->owned()) {
    if (opt->master_dtype() == DType::kF32 && !opt->on_drive()) {
      model::init_weights(*layout, cfg.seed, o.begin, o.end, opt->master().data() + o.local);
      continue;
    }
    std::vector<float> piece(std::min(model::kImportPieceElements, o.end - o.begin));
    for (std::size_t b = o.begin; b < o.end; b += piece.size()) {
      const std::size_t e = std::min(o.end, b + piece.size());
      model::init_weights(*layout, cfg.seed, b, e, piece.data());
      opt->write_master(o.local + (b - o.begin), {piece.data(), e - b});
    }
  }
}

// The initial or resumed weights and optimizer state, on the host.
void Session::init_weights() {
  if (resume_state) {
    const nlohmann::json st = load_checkpoint(resume_dir, *layout, *opt);
    start_step = st.at("step").get<std::int64_t>();
    tokens = st.at("tokens").get<std::int64_t>();
    try {
      loaders.train->restore(st.at("data"));
    } catch (const DataError& e) {
      throw DataError("checkpoint '" + resume_dir.string() + "': " + e.what());
    }
    if (st.contains("loss_scaler")) scaler.restore(st.at("loss_scaler"));
  } else {
    // Every rank makes (or reads) only the parts of the initial model it owns.
    if (!cfg.init_from.empty()) {
      model::import_hf_weights(cfg.init_from, *layout,
                               [&](std::size_t offset, std::span<const float> values) {
                                 opt->put_master(offset, values);
                               });
    } else {
      init_master();
    }
  }
  if (!resume_state && cfg.init_from.empty()) return;  // our own initialisation is finite
  // NaN, Inf or a negative second moment would train to NaN (or crash sqrt) at the first step.
  const std::string why = opt->find_invalid(*layout);
  double bad = why.empty() ? 0.0 : 1.0;
  if (ranks > 1) comm->all_reduce(&bad, 1, comm::ReduceOp::kSum);
  if (bad == 0.0) return;
  const std::string source = resume_state ? "checkpoint '" + resume_dir.string() + "'"
                                          : "--init-from '" + cfg.init_from + "'";
  throw CheckpointError(
      source + " holds " +
      (why.empty() ? std::string("invalid values on another rank (its message names them)") : why) +
      "; it cannot be trained from. Resume from an earlier checkpoint or use other weights");
}

Session::~Session() {
  if (!stream) return;
  try {
    updater.reset();  // waits for its threads and streams
    stream->synchronize();
  } catch (const std::exception&) {
    // The error was (or will be) reported by whoever failed; nothing to add while unwinding.
  }
}

// Last, once the run is sure to start, a resumed run takes up where its checkpoint left off:
// its checkpoints newer than the resumed step are moved aside, the temporary directories of its
// saves that were killed mid-write are removed, and its metrics after that step are dropped.
void Session::claim_outputs() {
  if (rank != 0 || !resume_state) return;
  if (!cfg.checkpoint_dir.empty()) {
    const std::string note =
        move_abandoned(cfg.checkpoint_dir, checkpoint_claim, std::uint64_t(start_step));
    if (!note.empty()) notes.push_back(note);
    for (std::string& n : remove_leftovers(checkpoint_claim))
      notes.push_back(std::move(n));
    const ckpt::AbandonedSaves saves = ckpt::remove_abandoned_saves(cfg.checkpoint_dir, run_id);
    for (const std::filesystem::path& p : saves.removed)
      notes.push_back("removed " + p.string() + ", left by a save of this run that was cut short");
    for (const std::string& k : saves.kept)
      notes.push_back("left " + k + ": remove it by hand once no save is writing it");
  }
  if (!cfg.metrics.empty() && !metrics_foreign.empty()) {  // --overwrite: a new file
    std::error_code ec;
    std::filesystem::remove(cfg.metrics, ec);
    if (ec)
      throw CheckpointError("--metrics '" + cfg.metrics + "' cannot be replaced: " + ec.message());
    notes.push_back("--overwrite: replaced --metrics '" + cfg.metrics + "' (" + metrics_foreign +
                    ")");
  } else if (!cfg.metrics.empty()) {
    const std::string note = drop_metrics_after(cfg.metrics, start_step);
    if (!note.empty()) notes.push_back(note);
  }
}

// With a GPU doing the compute, CPU Adam runs while the main thread enqueues the next step and
// the copy and accumulate threads move buckets: it leaves them two cores. On the host backend
// the compute and Adam take turns, so Adam gets them all.
int Session::adam_threads_default() const {
  if (dev->backend() != dev::Backend::kCuda) return core_share();
  const int cores = local_ranks <= 1 ? int(std::thread::hardware_concurrency()) : core_share();
  return std::max(1, cores - 2);
}

int Session::core_share() const {
  if (local_ranks <= 1) return 0;
  return std::max(1, int(std::thread::hardware_concurrency()) / local_ranks);
}

offload::EngineConfig Session::engine_config() const {
  offload::EngineConfig e;
  e.bucket_bytes = cfg.bucket_size;
  e.grad_accum = cfg.grad_accum;
  e.accumulate_on_device = accumulate_on_device;
  e.pin = cfg.pin;
  e.dpu = cfg.dpu;
  e.ranks = ranks;
  e.master = cfg.master_weights;
  e.state_on_drive = !cfg.state_dir.empty();
  e.param_window = param_window;
  e.rank = rank;
  e.comm_timeout = cfg.comm_timeout;
  return e;
}
double Session::evaluate() {
  updater->settle();
  loaders.val->reset();
  const LossSum s =
      sum_losses(*model, updater->parameters(), *loaders.val, cfg.eval_batches, *dev, *stream);
  double sum[2] = {s.sum, s.count};
  comm->all_reduce(sum, 2, comm::ReduceOp::kSum);  // the global batch's rows are on the ranks
  return sum[0] / sum[1];
}

nlohmann::json Session::trainer_state(std::int64_t step) const {
  // No random stream is consumed while training (the data order is a pure function of seed
  // and position; there is no dropout), so the seed is the whole RNG state.
  nlohmann::json state = {{"step", step},
                          {"run_id", run_id},
                          {"saved_at_ns", now_unix_ns()},
                          {"tokens", tokens},
                          {"data", loaders.train->state()},
                          {"config", cfg.to_json()},
                          {"rng", {{"seed", cfg.seed}}},
                          {"loss_scaler", scaler.state()}};
  if (std::string gemm = dev->gemm_choices(); !gemm.empty())
    state["gemm_choices"] = std::move(gemm);
  return state;
}

}  // namespace zo::train
