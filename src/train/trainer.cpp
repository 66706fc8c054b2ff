#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <map>
#include <numeric>
#include <sstream>
#include <thread>

#include "comm/comm.h"
#include "core/error.h"
#include "data/loader.h"
#include "data/token_source.h"
#include "device/event_clock.h"
#include "device/make_device.h"
#include "model/gpt.h"
#include "model/hf_weights.h"
#include "offload/engine.h"
#include "offload/host_optimizer.h"
#include "pinned_memory/host_buffer.h"
#include "report/metrics.h"
#include "report/trace.h"
#include "train/checkpoint_io.h"
#include "train/loss_scaler.h"
#include "train/plan.h"

namespace zo::train {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

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

// Per-phase sums over a run, for the summary line: mean busy and exposed time per step, and the
// step time over its largest component (1.0 = perfect overlap).
struct PhaseTotals {
  std::map<std::string, double> busy, exposed;
  double step_ms = 0.0;
  void add(const report::StepMetrics& m) {
    for (const auto& [k, v] : m.phase_ms)
      busy[k] += v;
    for (const auto& [k, v] : m.exposed_ms)
      exposed[k] += v;
    step_ms += m.step_ms;
  }
  std::string format(std::int64_t steps) const {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << "per step (ms):";
    for (const auto& [k, v] : busy) {
      os << " " << k << " " << v / double(steps);
      if (auto it = exposed.find(k); it != exposed.end())
        os << " (exposed " << it->second / double(steps) << ")";
    }
    // The largest component: the compute stream, or one of the offload pipeline's stages.
    double compute = 0.0, largest = 0.0;
    for (const char* k : {"forward", "backward"})
      if (auto it = busy.find(k); it != busy.end()) compute += it->second;
    largest = compute;
    for (const char* k : {"d2h", "adam", "h2d"})
      if (auto it = busy.find(k); it != busy.end()) largest = std::max(largest, it->second);
    if (largest > 0.0) {
      os << "; step " << step_ms / double(steps) << " = " << std::setprecision(2)
         << step_ms / largest << " x max(component)";
    }
    return os.str();
  }
};

// A trace per rank: rank 0 writes the given path, rank r <stem>.rank<r><ext>.
std::string trace_path(const std::string& path, int rank) {
  if (path.empty() || rank == 0) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() /
          (p.stem().string() + ".rank" + std::to_string(rank) + p.extension().string()))
      .string();
}

}  // namespace

struct Trainer::Impl {
  TrainConfig cfg;
  std::unique_ptr<comm::Communicator> comm;  // the job's ranks (one: a single process)
  int ranks = 1, rank = 0;
  int local_ranks = 1;  // ranks on this machine (they share its cores, memory and GPUs)
  // Test hook (docs/testing.md): ZO_TEST_STALL=<rank>:<step> makes that rank stop responding
  // at the start of that step for 4 x --comm-timeout, as a hung rank would.
  std::int64_t stall_step = 0;
  std::vector<std::vector<offload::OwnedRange>> partitions;  // data parallel: every rank's
  model::ModelSpec spec;
  std::unique_ptr<model::ParameterLayout> layout;
  int T = 0;
  std::optional<nlohmann::json> resume_state;
  std::filesystem::path resume_dir;
  data::Loaders loaders;
  std::unique_ptr<dev::Device> dev;
  std::unique_ptr<dev::Stream> stream;
  std::unique_ptr<offload::HostOptimizer> opt;
  std::unique_ptr<model::Gpt> gpt;
  bool resident = false;  // optimizer state on the device (see TrainConfig::mode)
  report::Trace trace;
  std::unique_ptr<offload::Engine> engine;  // offload mode
  dev::Buffer params, grads, norm;          // resident mode: (n) act dtype; fp32 scratch
  dev::Buffer master_dev, m_dev, v_dev;     // resident mode: fp32 (n) each
  pinned::HostBuffer params_out;            // resident mode: 16-bit staging for the upload
  dev::EventClock clock;
  DType act = DType::kF32;
  std::int64_t start_step = 0, tokens = 0;
  LossScaler scaler;
  std::vector<std::unique_ptr<dev::Event>> events;
  std::vector<std::int32_t> inputs, targets;
  std::vector<float> losses_host;

  explicit Impl(const TrainConfig& c) : cfg(c) {
    cfg.validate_flags();
    // Data parallel when started by mpirun (or ZO_WORLD_SIZE > 1): every rank must run the
    // same configuration, checked before anything is opened.
    comm = comm::make_comm_from_env(cfg.comm_timeout);
    ranks = comm->size();
    rank = comm->rank();
    local_ranks = std::max(1, comm::rank_info_from_env().local_size);
    if (ranks > 1) {
      if (const char* s = std::getenv("ZO_TEST_STALL")) {
        int r = -1;
        long long st = 0;
        if (std::sscanf(s, "%d:%lld", &r, &st) == 2 && r == rank) stall_step = st;
      }
      comm::check_same_on_all_ranks(*comm, "the training flags", cfg.to_json().dump());
      if (cfg.mode == "resident") {
        throw std::invalid_argument(
            "--mode resident: a data-parallel job keeps the optimizer state partitioned on the "
            "ranks' hosts (ZeRO-2 with offload); use --mode offload or auto");
      }
    }
    // The model: from the checkpoint when resuming without --model.
    if (!cfg.resume.empty()) {
      resume_dir = resolve_checkpoint(cfg.resume, cfg.checkpoint_dir);
      resume_state = read_trainer_state(resume_dir);
    }
    if (cfg.model.empty()) {
      spec = resume_state ? checkpoint_spec(*resume_state) : model::load_model_spec("tiny");
    } else {
      spec = model::load_model_spec(cfg.model);
    }
    cfg.validate(spec);
    T = cfg.seq_len > 0 ? cfg.seq_len : spec.block_size;
    layout = std::make_unique<model::ParameterLayout>(spec);

    // Data, opened and validated before anything large is allocated.
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

    // The memory plan, checked before allocating.
    {
      dev::DeviceRequest r;
      r.device = cfg.device;
      r.precision = cfg.precision;
      r.capacity_bytes = cfg.device_memory;
      // Ranks sharing a machine share its cores: "all cores" means this rank's share.
      r.threads = cfg.threads == 0 ? core_share() : cfg.threads;
      r.gpu_ordinal = comm->local_rank();  // one GPU per rank on a machine
      dev = dev::make_device(r);
    }
    // Ranks sharing a machine: run this one (and the Adam threads it creates) next to its GPU,
    // unless the launcher bound it already (mpirun --bind-to ...).
    if (ranks > 1) pinned::run_near_node(dev::numa_node_of(*dev));
    act = dev->act_dtype();
    scaler = LossScaler(scaler_config(cfg, act));
    PlanInput pi{spec,
                 {cfg.micro_batch, T, cfg.recompute},
                 act,
                 cfg.optimizer_state,
                 dev->capacity_bytes(),
                 // Ranks on one machine share its memory.
                 pinned::host_available_bytes() / std::size_t(local_ranks),
                 false,
                 engine_config()};
    // auto: resident on a GPU when everything fits there (and the state is fp32), else offload.
    const ModeChoice choice = choose_mode(pi, dev->backend() == dev::Backend::kCuda);
    resident = cfg.mode == "auto" ? choice.choose_resident && ranks == 1 : cfg.mode == "resident";
    pi.resident = resident;
    const MemoryPlan& plan = resident ? choice.resident : choice.offload;
    if (!plan.device_fits || !plan.host_fits) {
      throw std::runtime_error("this run does not fit in memory:\n" + plan.format(pi));
    }

    offload::OptimizerConfig oc;
    oc.adam.beta1 = cfg.beta1;
    oc.adam.beta2 = cfg.beta2;
    oc.adam.eps = cfg.eps;
    oc.adam.weight_decay = cfg.weight_decay;
    oc.adam.lr = cfg.lr.max_lr;
    oc.decay_policy.embeddings = cfg.decay_embeddings;
    oc.decay_policy.biases_and_norms = cfg.decay_biases_and_norms;
    oc.state_dtype = cfg.optimizer_state;
    oc.threads = cfg.adam_threads == 0 ? core_share() : cfg.adam_threads;
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
    opt = std::make_unique<offload::HostOptimizer>(
        *layout, oc,
        ranks > 1 ? partitions[std::size_t(rank)] : std::vector<offload::OwnedRange>{});

    if (!cfg.trace.empty()) trace = report::Trace(trace_path(cfg.trace, rank));
    stream = dev->create_stream();
    const std::size_t n = layout->size(), esize = dtype_size(act);
    if (resident) {
      params = dev->alloc(n * esize, "parameters");
      grads = dev->alloc(n * esize, "gradients");
      norm = dev->alloc(64, "gradient norm");
      master_dev = dev->alloc(n * 4, "fp32 master weights");
      m_dev = dev->alloc(n * 4, "Adam m");
      v_dev = dev->alloc(n * 4, "Adam v");
      if (act != DType::kF32) params_out = pinned::HostBuffer(n * esize);
    } else {
      engine = std::make_unique<offload::Engine>(*dev, *stream, *layout, *opt, engine_config(),
                                                 &trace, comm.get());
    }
    gpt = std::make_unique<model::Gpt>(*dev, *layout,
                                       model::GptShape{cfg.micro_batch, T, cfg.recompute});
    clock = dev::EventClock(*dev, *stream, trace.now_us());
    for (int k = 0; k < 3 * cfg.grad_accum; ++k)
      events.push_back(dev->create_event());
    losses_host.resize(std::size_t(cfg.grad_accum) * cfg.micro_batch * T);

    if (resume_state) {
      const nlohmann::json st = load_checkpoint(resume_dir, *layout, *opt);
      start_step = st.at("step").get<std::int64_t>();
      tokens = st.at("tokens").get<std::int64_t>();
      loaders.train->restore(st.at("data"));
      if (st.contains("loss_scaler")) scaler.restore(st.at("loss_scaler"));
    } else {
      // Every rank builds the whole initial model (deterministic) and keeps its partition.
      std::vector<float> whole(opt->owns_all() ? 0 : n);
      const std::span<float> dst = opt->owns_all() ? opt->master() : std::span<float>(whole);
      if (!cfg.init_from.empty()) {
        model::import_hf_weights(cfg.init_from, *layout, dst);
      } else {
        model::init_gpt2(*layout, cfg.seed, dst.data());
      }
      if (!opt->owns_all()) opt->take_owned(whole.data(), opt->master().data());
    }
    if (resident) {
      upload_params();
      upload_optimizer_state();
    } else {
      engine->upload_all();
    }
  }

  // 0 (all cores) for a single rank per machine, else the cores over the ranks on this machine.
  int core_share() const {
    if (local_ranks <= 1) return 0;
    return std::max(1, int(std::thread::hardware_concurrency()) / local_ranks);
  }

  offload::EngineConfig engine_config() const {
    offload::EngineConfig e;
    e.bucket_bytes = cfg.bucket_size;
    e.grad_accum = cfg.grad_accum;
    e.pin = cfg.pin;
    e.dpu = cfg.dpu;
    e.ranks = ranks;
    e.rank = rank;
    e.comm_timeout = cfg.comm_timeout;
    return e;
  }
  const void* params_ptr() const { return resident ? params.data() : engine->params(); }
  std::function<void(int)> read_hook() {
    if (!engine) return {};
    return [this](int g) { engine->before_read(g); };
  }
  // Makes master, m, v and the device parameters agree (checkpoints, evaluation, the end).
  void settle() {
    if (engine) engine->drain();
  }

  // Resident mode keeps master, m and v on the device; the HostOptimizer's arrays stage them.
  void upload_optimizer_state() {
    const std::size_t bytes = layout->size() * 4;
    dev->copy_to_device(master_dev.data(), opt->master().data(), bytes, *stream);
    dev->copy_to_device(m_dev.data(), opt->exp_avg().data, bytes, *stream);
    dev->copy_to_device(v_dev.data(), opt->exp_avg_sq().data, bytes, *stream);
    stream->synchronize();  // the host arrays may change right after
  }
  void download_optimizer_state() {
    const std::size_t bytes = layout->size() * 4;
    dev->copy_to_host(opt->master().data(), master_dev.data(), bytes, *stream);
    dev->copy_to_host(opt->exp_avg().data, m_dev.data(), bytes, *stream);
    dev->copy_to_host(opt->exp_avg_sq().data, v_dev.data(), bytes, *stream);
    stream->synchronize();
  }

  // AdamW on the device, run by run (weight decay differs between runs).
  void resident_step(float lr, float coef) {
    const std::int64_t t = opt->state().step + 1;
    const std::size_t esize = dtype_size(act);
    AdamConfig c = opt->config().adam;
    c.lr = lr;
    const float wd = c.weight_decay;
    for (const auto& r : opt->runs()) {
      c.weight_decay = r.decay ? wd : 0.0f;
      dev->adamw(master_dev.as<float>() + r.begin, m_dev.as<float>() + r.begin,
                 v_dev.as<float>() + r.begin, grads.as<char>() + r.begin * esize,
                 params.as<char>() + r.begin * esize, r.end - r.begin, c, t, coef, *stream);
    }
    opt->state().step = t;
  }

  // Work still queued on the stream reads and writes the buffers below: finish it first.
  ~Impl() {
    if (!stream) return;
    try {
      engine.reset();  // waits for its threads and streams
      stream->synchronize();
    } catch (const std::exception&) {
      // The error was (or will be) reported by whoever failed; nothing to add while unwinding.
    }
  }

  void upload_params() {
    const std::size_t n = layout->size();
    if (act == DType::kF32) {
      dev->copy_to_device(params.data(), opt->master().data(), n * 4, *stream);
    } else {
      convert_from_float(opt->master().data(), params_out.data(), act, n);
      dev->copy_to_device(params.data(), params_out.data(), n * 2, *stream);
    }
  }

  double evaluate() {
    settle();
    data::DataLoader& val = *loaders.val;
    val.reset();
    const std::size_t BT = std::size_t(cfg.micro_batch) * T;
    std::vector<float> l(BT * cfg.eval_batches);
    for (int b = 0; b < cfg.eval_batches; ++b) {
      val.next_batch(inputs, targets);
      gpt->set_batch(inputs, targets, *stream);
      gpt->forward(params_ptr(), T, true, 0.0f, *stream, read_hook());
      dev->copy_to_host(l.data() + b * BT, gpt->losses(), BT * 4, *stream);
    }
    stream->synchronize();
    double sum[2] = {std::accumulate(l.begin(), l.end(), 0.0), double(l.size())};
    comm->all_reduce(sum, 2, comm::ReduceOp::kSum);  // the global batch's rows are on the ranks
    return sum[0] / sum[1];
  }

  nlohmann::json trainer_state(std::int64_t step) const {
    // No random stream is consumed while training (the data order is a pure function of seed
    // and position; there is no dropout), so the seed is the whole RNG state.
    return {{"step", step},
            {"tokens", tokens},
            {"data", loaders.train->state()},
            {"config", cfg.to_json()},
            {"rng", {{"seed", cfg.seed}}},
            {"loss_scaler", scaler.state()}};
  }
};

Trainer::Trainer(const TrainConfig& config) : impl_(std::make_unique<Impl>(config)) {}
Trainer::~Trainer() = default;
const model::ModelSpec& Trainer::spec() const {
  return impl_->spec;
}

TrainSummary Trainer::run(const std::function<void(const std::string&)>& log) {
  Impl& I = *impl_;
  const TrainConfig& cfg = I.cfg;
  auto say = [&](const std::string& s) {  // rank 0 speaks for the job
    if (log && !cfg.quiet && I.rank == 0) log(s);
  };
  const std::size_t n = I.layout->size();
  const int B = cfg.micro_batch, T = I.T, A = cfg.grad_accum, R = I.ranks;
  const std::size_t BT = std::size_t(B) * T;
  // The loss is the mean over the global batch (R ranks x A micro-batches x B x T tokens); the
  // reduce-scatter sums the ranks' gradients.
  const std::size_t step_tokens = BT * std::size_t(A) * std::size_t(R);
  const float dloss_unscaled = 1.0f / float(step_tokens);
  const double fpt = report::flops_per_token(n, I.spec.n_layer, I.spec.n_embd, T);

  report::MetricsWriter metrics;
  if (!cfg.metrics.empty() && I.rank == 0) {
    metrics = report::MetricsWriter(cfg.metrics, I.start_step > 0);
  }
  {
    std::ostringstream os;
    os << "model " << I.spec.name << ": " << n << " parameters (n_layer " << I.spec.n_layer
       << ", n_head " << I.spec.n_head << ", n_embd " << I.spec.n_embd << ", vocab "
       << I.spec.vocab_size << ", block " << I.spec.block_size << ")\n"
       << "device " << I.dev->name() << "; batch " << B << " x " << T << " x " << A << " accum";
    if (R > 1) os << " x " << R << " ranks";
    os << " = " << step_tokens << " tokens/step\n";
    if (R > 1) {
      os << "data parallel: " << R << " ranks over " << I.comm->name() << ", each holding 1/" << R
         << " of the optimizer state (" << I.opt->size() << " parameters on rank 0)\n";
    }
    os << (I.resident ? std::string("resident mode: AdamW on the device")
                      : "offload mode: AdamW on the CPU (" +
                            std::string(cpu_adam::isa_name(cpu_adam::default_isa())) + ")")
       << " with " << dtype_name(cfg.optimizer_state) << " state\n"
       << "data: " << I.loaders.train->describe();
    if (I.loaders.val) os << "\n      " << I.loaders.val->describe();
    if (I.start_step > 0)
      os << "\nresumed from " << I.resume_dir.string() << " at step " << I.start_step;
    say(os.str());
  }

  TrainSummary summary;
  summary.first_step = I.start_step;
  double ema_step_ms = 0.0;
  const auto run_t0 = Clock::now();
  std::int64_t run_tokens = 0;
  PhaseTotals totals;
  for (std::int64_t step = I.start_step; step < cfg.steps; ++step) {
    report::ScopedSpan step_span(&I.trace, "main", "step", {{"step", step + 1}});
    if (I.stall_step == step + 1) {
      std::this_thread::sleep_for(std::chrono::duration<double>(4 * cfg.comm_timeout));
      throw std::runtime_error("rank " + std::to_string(I.rank) + " stalled by ZO_TEST_STALL");
    }
    const auto t0 = Clock::now();
    const float lr = cfg.lr.at(step);
    const float scale = I.scaler.scale();
    const float dloss = dloss_unscaled * scale;
    const bool dpu = cfg.dpu && step >= cfg.dpu_warmup;
    if (I.engine) {
      I.engine->begin_step(dpu);
    } else {
      I.dev->fill_zero(I.grads.data(), I.grads.bytes(), *I.stream);
    }
    const void* params = I.params_ptr();
    const auto hook = I.read_hook();
    for (int a = 0; a < A; ++a) {
      I.loaders.train->next_batch(I.inputs, I.targets);
      I.gpt->set_batch(I.inputs, I.targets, *I.stream);
      I.dev->record(*I.events[3 * a], *I.stream);
      {
        const report::NvtxRange range("forward");  // kernels are enqueued inside it (ncu --nvtx)
        I.gpt->forward(params, T, true, dloss, *I.stream, hook);
      }
      I.dev->record(*I.events[3 * a + 1], *I.stream);
      {
        const report::NvtxRange range("backward");
        if (I.engine) {
          I.engine->begin_micro_batch(a);
          I.gpt->backward(params, *I.engine, *I.stream);
        } else {
          I.gpt->backward(params, I.grads.data(), *I.stream);
        }
      }
      I.dev->record(*I.events[3 * a + 2], *I.stream);
      I.dev->copy_to_host(I.losses_host.data() + a * BT, I.gpt->losses(), BT * 4, *I.stream);
    }
    // The step's one host synchronisation: gradient statistics (and the losses).
    const auto wait_t0 = Clock::now();
    double sumsq = 0.0;
    bool nonfinite = false;
    if (I.engine) {
      const offload::GradStats st = I.engine->finish_gradients();
      sumsq = st.sumsq;
      nonfinite = st.nonfinite;
      I.stream->synchronize();  // the losses (queued after the last bucket)
    } else {
      float s = 0.0f;
      I.dev->fill_zero(I.norm.data(), 4, *I.stream);
      I.dev->sum_squares(I.norm.as<float>(), I.grads.data(), n, *I.stream);
      I.dev->copy_to_host(&s, I.norm.data(), 4, *I.stream);
      I.stream->synchronize();  // the norm and the losses
      sumsq = s;
    }
    const double wait_ms = ms_since(wait_t0);

    report::StepMetrics m;
    m.step = step + 1;
    m.lr = lr;
    {
      double l[2] = {std::accumulate(I.losses_host.begin(), I.losses_host.end(), 0.0),
                     double(I.losses_host.size())};
      if (R > 1) I.comm->all_reduce(l, 2, comm::ReduceOp::kSum);
      m.loss = l[0] / l[1];
    }
    const bool injected =
        std::find(cfg.inject_overflow_steps.begin(), cfg.inject_overflow_steps.end(), step + 1) !=
        cfg.inject_overflow_steps.end();
    m.grad_norm = injected || nonfinite ? INFINITY : std::sqrt(sumsq) / double(scale);
    double fwd = 0, bwd = 0;
    for (int a = 0; a < A; ++a) {
      fwd += I.events[3 * a + 1]->elapsed_ms_since(*I.events[3 * a]);
      bwd += I.events[3 * a + 2]->elapsed_ms_since(*I.events[3 * a + 1]);
      if (I.trace.enabled()) {
        I.trace.span("compute", "forward", I.clock.us(*I.events[3 * a]),
                     I.clock.us(*I.events[3 * a + 1]), {{"micro_batch", a}});
        I.trace.span("compute", "backward", I.clock.us(*I.events[3 * a + 1]),
                     I.clock.us(*I.events[3 * a + 2]), {{"micro_batch", a}});
      }
    }
    const auto opt_t0 = Clock::now();
    const bool overflow = !std::isfinite(m.grad_norm);
    I.scaler.update(overflow);
    m.loss_scale = scale;
    if (overflow) {
      m.skipped = true;  // nothing changes; the scale backs off and the next step retries
      ++summary.skipped_steps;
    } else {
      // Unscaling and clipping fold into the one multiplier the optimizer applies.
      const float clip = cfg.grad_clip > 0.0f && m.grad_norm > cfg.grad_clip
                             ? static_cast<float>(cfg.grad_clip / (m.grad_norm + 1e-6))
                             : 1.0f;
      const float coef = clip / scale;
      if (I.resident) {
        I.resident_step(lr, coef);
      } else {
        I.engine->start_update(lr, coef);  // runs on the Adam thread, overlapping what follows
      }
    }
    const double opt_ms = ms_since(opt_t0);
    I.tokens += std::int64_t(step_tokens);
    run_tokens += std::int64_t(step_tokens);
    m.tokens = I.tokens;
    m.step_ms = ms_since(t0);
    m.tokens_per_s = double(step_tokens) / (m.step_ms * 1e-3);
    m.tflops = fpt * m.tokens_per_s * 1e-12;
    if (I.engine) {
      const offload::PhaseTimes p = I.engine->phase_times();
      m.phase_ms = {
          {"forward", fwd}, {"backward", bwd}, {"d2h", p.d2h}, {"adam", p.adam}, {"h2d", p.h2d}};
      m.exposed_ms = {{"d2h", p.d2h_exposed}, {"adam", p.adam_exposed}, {"h2d", p.h2d_exposed}};
    } else {
      m.phase_ms = {{"forward", fwd}, {"backward", bwd}, {"optimizer", opt_ms}, {"wait", wait_ms}};
    }
    totals.add(m);

    const bool last = step + 1 == cfg.steps;
    if (I.loaders.val && ((cfg.eval_interval > 0 && (step + 1) % cfg.eval_interval == 0) || last)) {
      m.val_loss = I.evaluate();
      summary.final_val_loss = m.val_loss;
    }
    metrics.write(m);
    summary.losses.push_back(m.loss);
    summary.step_ms.push_back(m.step_ms);
    if (summary.steps_done == 0) summary.first_loss = m.loss;
    summary.final_loss = m.loss;
    ++summary.steps_done;
    ema_step_ms = summary.steps_done == 1 ? m.step_ms : 0.9 * ema_step_ms + 0.1 * m.step_ms;
    if ((step + 1) % cfg.log_interval == 0 || last || m.skipped) {
      say(report::progress_line(m, cfg.steps, double(cfg.steps - step - 1) * ema_step_ms * 1e-3));
    }
    if (!cfg.checkpoint_dir.empty() &&
        ((cfg.checkpoint_interval > 0 && (step + 1) % cfg.checkpoint_interval == 0) || last)) {
      if (I.resident) I.download_optimizer_state();
      I.settle();
      const auto dir =
          save_checkpoint(cfg.checkpoint_dir, *I.layout, *I.opt, I.trainer_state(step + 1),
                          cfg.keep_last, *I.comm, I.partitions);
      summary.last_checkpoint = dir.string();
      say("checkpoint " + dir.string());
    }
  }
  I.settle();
  I.stream->synchronize();
  const double run_s = ms_since(run_t0) * 1e-3;
  summary.tokens_per_s = run_s > 0 ? double(run_tokens) / run_s : 0.0;
  {
    std::ostringstream os;
    os.precision(4);
    os << "done: " << summary.steps_done << " steps in " << report::format_duration(run_s) << ", "
       << std::fixed << std::setprecision(0) << summary.tokens_per_s << " tokens/s";
    os << std::setprecision(4) << ", loss " << summary.first_loss << " -> " << summary.final_loss;
    if (summary.final_val_loss) os << ", val loss " << *summary.final_val_loss;
    if (summary.skipped_steps) os << ", " << summary.skipped_steps << " skipped";
    say(os.str());
    if (summary.steps_done > 0) say(totals.format(summary.steps_done));
  }
  if (I.trace.enabled()) {
    I.trace.write();
    say("trace " + I.trace.path().string() + " (" + std::to_string(I.trace.event_count()) +
        " events; open in https://ui.perfetto.dev)");
  }
  return summary;
}

}  // namespace zo::train
