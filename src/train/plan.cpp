#include "train/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "core/bytes.h"
#include "optim/host_optimizer.h"
#include "train/checkpoint_io.h"
#include "train/config.h"
#include "train/evaluate.h"
#include "train/updater.h"

namespace zo::train {

AccumPlacement parse_accum_placement(const std::string& s) {
  if (s == "auto") return AccumPlacement::kAuto;
  if (s == "device") return AccumPlacement::kDevice;
  if (s == "host") return AccumPlacement::kHost;
  throw std::invalid_argument("--grad-accum-on must be auto, device or host");
}

namespace {

// The optimizer state of one rank on a drive (its share with data parallelism): the file of chunk
// records, its staging slots in host memory, and the bytes a step moves (every record read once
// and written once).
void plan_drive(MemoryPlan& p, const PlanInput& in, const model::ParameterLayout& layout,
                const std::vector<optim::OwnedRange>& owned) {
  const std::vector<optim::SegmentSpan> segments = optim::state_segments(layout, owned);
  const optim::StateShape shape{dtype_size(in.engine.master),
                                state_element_bytes(in.optimizer_state),
                                in.optimizer_state == StateFormat::kQ8};
  const optim::PagerBytes b =
      optim::pager_bytes(optim::plan_chunks(segments, in.state_chunk_elements), shape);
  p.host.push_back({"optimizer state staging (" + std::to_string(in.state_slots) + " chunks)",
                    in.state_slots * b.slot, false});
  // A checkpoint reads a transposed (GPT-2 Conv1D) tensor whole before writing it in HF order.
  std::size_t transposed = 0;
  for (const auto& t : layout.tensors())
    if (t.hf_transposed) transposed = std::max(transposed, t.numel);
  if (transposed > 0) {
    p.host.push_back({"checkpoint copy of one transposed tensor", transposed * 4, false});
  }
  std::string what = std::string(dtype_name(in.engine.master)) + " master, m and v (";
  what.append(state_format_name(in.optimizer_state)).append(")");
  if (in.engine.ranks > 1) what += " (1/" + std::to_string(in.engine.ranks) + ")";
  p.drive.push_back({what, b.file});
  p.drive_traffic = "per step: " + format_bytes(b.file) + " read and " + format_bytes(b.file) +
                    " written (each chunk once each way)";
  if (in.drive_gb_per_s > 0.0) {
    // With DPU the update overlaps the next step's forward and backward (6 flop per parameter
    // and token): hidden from seconds x F / (6 N) tokens a step.
    const double seconds = 2.0 * double(b.file) / (in.drive_gb_per_s * 1e9);
    const double tokens =
        seconds * in.device_tflops * 1e12 / (6.0 * double(in.spec.num_parameters()));
    char text[200];
    std::snprintf(text, sizeof text,
                  "; %.2f s at %.3g GB/s each way, hidden behind the device's work (DPU) from "
                  "%.0f tokens per step at %.0f TFLOP/s",
                  seconds, in.drive_gb_per_s, std::ceil(tokens), in.device_tflops);
    p.drive_traffic += text;
  }
}

}  // namespace

MemoryPlan plan_memory(const PlanInput& in) {
  MemoryPlan p;
  const std::size_t n = in.spec.num_parameters();
  const std::size_t esize = dtype_size(in.act_dtype);
  const model::ParameterLayout layout(in.spec);
  const offload::EngineFootprint f = offload::engine_footprint(layout, in.act_dtype, in.engine);
  const int window = in.resident ? 0 : in.engine.param_window;
  if (window > 0) {
    p.device.push_back({"parameters (" + std::string(dtype_name(in.act_dtype)) + ", " +
                            std::to_string(window) + " of " + std::to_string(in.spec.n_layer) +
                            " blocks)",
                        f.device_params});
  } else {
    p.device.push_back({"parameters (" + std::string(dtype_name(in.act_dtype)) + ")", n * esize});
  }
  if (in.resident) {
    p.device.push_back({"gradients", n * esize});
    if (resident_accumulates_in_f32(in.act_dtype, in.engine.grad_accum))
      p.device.push_back({"fp32 gradient accumulator", n * 4});
  } else {
    p.device.push_back(
        {"gradient buckets (own + " + std::to_string(in.engine.device_slots) + " ring slots)",
         f.device_grad_slots + f.device_stats});
    if (f.device_comm) p.device.push_back({"data-parallel shards and all-gather", f.device_comm});
    if (f.device_accum) p.device.push_back({"fp32 gradient sum (--grad-accum)", f.device_accum});
  }
  p.device.push_back({"activations (B=" + std::to_string(in.shape.B) + ", T=" +
                          std::to_string(in.shape.T) + (in.shape.recompute ? ", recompute)" : ")"),
                      model::activation_bytes(in.spec, in.shape, esize), false});
  if (in.resident) {
    p.device.push_back({"gradient norm and step gate", 64, false});
    // One entry per run of tensors with the same weight decay: at most one per tensor.
    p.device.push_back({"AdamW run table", layout.tensors().size() * 8, false});
  }
  if (in.spec.llama())
    p.device.push_back({"RoPE inverse frequencies", std::size_t(in.spec.head_dim / 2) * 4, false});
  const std::size_t sb = state_element_bytes(in.optimizer_state);
  std::string state = "(";  // built by append: GCC 12 warns falsely on "(" + string (PR 105329)
  state.append(state_format_name(in.optimizer_state)).append(")");
  if (in.resident) {
    p.device.push_back({"fp32 master weights", n * 4});
    p.device.push_back({"Adam m " + state, n * sb});
    p.device.push_back({"Adam v " + state, n * sb});
    p.host.push_back({"checkpoint staging (master, m, v)", n * (4 + 2 * sb)});
  } else {
    // Data parallel: this rank's partition only.
    const std::vector<optim::OwnedRange> partition =
        offload::engine_partition(layout, in.act_dtype, in.engine);
    std::size_t owned = 0;
    for (const auto& o : partition)
      owned += o.end - o.begin;
    const std::string part =
        in.engine.ranks > 1 ? " (1/" + std::to_string(in.engine.ranks) + ")" : "";
    // q8: each block of 2048 of a tensor's owned part carries an fp32 maximum.
    const std::size_t scales =
        in.optimizer_state == StateFormat::kQ8 ? 4 * optim::q8_block_count(layout, partition) : 0;
    if (in.engine.state_on_drive) {
      plan_drive(p, in, layout, partition);
    } else {
      p.host.push_back({std::string(dtype_name(in.engine.master)) + " master weights" + part,
                        owned * dtype_size(in.engine.master)});
      p.host.push_back({"Adam m " + state + part, owned * sb + scales});
      p.host.push_back({"Adam v " + state + part, owned * sb + scales});
    }
    const std::string two = in.engine.dpu ? " x2 (DPU)" : "";
    if (f.host_grads) p.host.push_back({"gradient landing buffer" + two, f.host_grads});
    if (f.host_accum) p.host.push_back({"fp32 accumulated gradients" + two, f.host_accum});
    if (f.host_ring) p.host.push_back({"accumulation ring", f.host_ring});
    if (f.host_upload) {
      p.host.push_back({std::string(dtype_name(in.act_dtype)) + " upload buffer", f.host_upload});
    }
  }
  p.host.push_back({"checkpoint, import and init buffers",
                    checkpoint_buffer_bytes(layout, in.engine.ranks), false});
  if (in.trace_events > 0) {
    p.host.push_back({"--trace events (at most " + std::to_string(in.trace_events) + ")",
                      in.trace_events * kTraceEventBytes, false});
  }
  // The step's losses (every micro-batch), evaluation's (at most 16 batches in flight) and the
  // tokens' two staging slots: page-locked on a GPU.
  const std::size_t BT = std::size_t(in.shape.B) * std::size_t(in.shape.T);
  p.host.push_back({"loss and token staging",
                    BT * 4 * (std::size_t(in.engine.grad_accum) + kEvalWindow + 4), false});
  for (const auto& l : p.drive)
    p.drive_total += l.bytes;
  for (const auto& l : p.device)
    p.device_total += l.bytes;
  for (const auto& l : p.host)
    p.host_total += l.bytes;
  p.device_fits = in.device_capacity == 0 || p.device_total <= in.device_capacity;
  p.host_fits = in.host_available == 0 || p.host_total <= in.host_available;
  std::ostringstream advice;
  if (!p.device_fits) {
    advice << "device needs " << format_bytes(p.device_total) << " but has "
           << format_bytes(in.device_capacity) << ": ";
    if (!in.shape.recompute) advice << "enable --recompute, ";
    if (in.shape.B > 1)
      advice << "use a smaller --micro-batch (with --grad-accum to keep the batch), ";
    advice << "shorten --seq-len, ";
    if (in.resident) advice << "use --mode offload (optimizer state on the host), ";
    if (!in.resident && window == 0 && in.engine.ranks == 1 && !in.engine.dpu) {
      advice << "use --mode stream (a window of blocks on the device), ";
    }
    if (f.device_accum && !in.resident) {
      advice << "use --grad-accum-on host (micro-batches summed on the host), ";
    }
    advice << "or give the device more memory (--device-memory)";
  }
  if (!p.host_fits) {
    if (!p.device_fits) advice << "; ";
    advice << "host needs " << format_bytes(p.host_total) << " but has "
           << format_bytes(in.host_available) << " available: ";
    if (in.optimizer_state != StateFormat::kQ8 && !in.engine.state_on_drive) {
      advice << "use --optimizer-state "
             << (in.optimizer_state == StateFormat::kF32 ? "bf16 or q8, " : "q8, ");
    }
    if (!in.resident && in.engine.master == DType::kF32 && !in.engine.state_on_drive)
      advice << "--master-weights bf16, ";
    if (!in.resident && !in.engine.state_on_drive) {
      PlanInput on_drive = in;
      on_drive.engine.state_on_drive = true;
      const std::size_t host = plan_memory(on_drive).host_total;
      advice << "--state-dir DIR (master, m and v on a drive: the host then needs "
             << format_bytes(host) << (host <= in.host_available ? ", which fits" : "") << "), ";
    }
    if (in.engine.state_on_drive && in.engine.dpu) advice << "drop --dpu (one landing buffer), ";
    advice << "or a smaller model";
  }
  p.advice = advice.str();
  if (window > 0) {
    // Every block a pass reads that the window does not hold is copied: after an update every
    // block (the first forward of a step), then per pass all but the `window` the last one left.
    const std::size_t L = std::size_t(in.spec.n_layer), K = std::size_t(window);
    const std::size_t A = std::size_t(in.engine.grad_accum);
    const std::size_t copies = L + (2 * A - 1) * (L - std::min(K, L));
    const std::size_t block = layout.groups()[1].size() * esize;
    // Forward reads a block for 2 flop per parameter and token and its copy moves esize bytes
    // per parameter (backward, 4 flop, copies fewer blocks): the copies hide behind the compute
    // from esize * F / (2 R) tokens per micro-batch.
    const double hide = double(esize) * in.device_tflops * 1e12 / (2.0 * in.link_gb_per_s * 1e9);
    char rates[160];
    std::snprintf(rates, sizeof rates,
                  "%.0f tokens per micro-batch (now %lld) at %g GB/s and %g TFLOP/s",
                  std::ceil(hide), static_cast<long long>(in.shape.B) * in.shape.T,
                  in.link_gb_per_s, in.device_tflops);
    p.streaming = "the embeddings and the final group stay, the blocks pass through " +
                  std::to_string(window) + " slots of " + format_bytes(block) +
                  "; parameters copied to the device per step: " + format_bytes(copies * block) +
                  " (" + std::to_string(copies) +
                  " block copies); copies hidden (predicted) from " + rates;
  }
  return p;
}

const char* mode_name(const PlanInput& in) {
  if (in.resident) return "resident";
  return in.engine.param_window > 0 ? "stream" : "offload";
}

int default_param_window(const model::ModelSpec& spec) {
  if (spec.n_layer < 2) {
    throw std::invalid_argument("stream mode passes the blocks through a window of at least 2; " +
                                spec.name + " has " + std::to_string(spec.n_layer) +
                                " block: use --mode offload");
  }
  return std::min(3, spec.n_layer);
}

int offered_param_window(const model::ModelSpec& spec, const std::string& mode, int param_window,
                         int ranks, bool dpu, const std::string& grad_accum_on) {
  const bool offered = mode == "stream" || (mode == "auto" && ranks == 1 && !dpu &&
                                            grad_accum_on != "device" && spec.n_layer >= 2);
  if (!offered) return 0;
  return param_window != 0 ? param_window : default_param_window(spec);
}

namespace {

// The offload plan with --grad-accum's micro-batches summed where in.grad_accum_on says; auto:
// on the device when that plan fits, else on the host (today's bytes on the device).
MemoryPlan plan_offload(PlanInput in, offload::EngineConfig& engine) {
  in.resident = false;
  in.engine.accumulate_on_device = false;
  if (in.engine.grad_accum == 1) {
    engine = in.engine;
    return plan_memory(in);
  }
  const std::string accum = "--grad-accum " + std::to_string(in.engine.grad_accum) + ": ";
  const std::string on_device = "summed in fp32 on the device, one bucket per step to the host";
  const std::string on_host = "every micro-batch's buckets to the host, summed there in fp32";
  if (in.engine.param_window > 0) {  // a device sum would hold a gradient of every parameter
    engine = in.engine;
    MemoryPlan p = plan_memory(in);
    p.accumulation = accum + on_host + " (stream mode)";
    return p;
  }
  in.engine.accumulate_on_device = in.grad_accum_on != AccumPlacement::kHost;
  engine = in.engine;
  MemoryPlan p = plan_memory(in);
  if (in.grad_accum_on == AccumPlacement::kDevice) {
    p.accumulation = accum + on_device + " (--grad-accum-on device)";
  } else if (in.grad_accum_on == AccumPlacement::kHost) {
    p.accumulation = accum + on_host + " (--grad-accum-on host)";
  } else if (p.device_fits) {
    p.accumulation = accum + on_device + " (auto: the fp32 sum fits)";
  } else {
    const std::size_t sum =
        offload::engine_footprint(model::ParameterLayout(in.spec), in.act_dtype, in.engine)
            .device_accum;
    in.engine.accumulate_on_device = false;
    engine = in.engine;
    p = plan_memory(in);
    p.accumulation = accum + on_host + " (auto: the fp32 sum, " + format_bytes(sum) +
                     ", does not fit on the device)";
  }
  return p;
}

}  // namespace

ModeChoice choose_mode(PlanInput in, bool gpu) {
  ModeChoice c;
  const int window = in.engine.param_window;
  in.engine.param_window = 0;
  in.resident = true;
  c.resident = plan_memory(in);
  c.offload = plan_offload(in, c.offload_engine);
  in.resident = false;
  if (window > 0) {
    in.engine.param_window = window;
    c.stream = plan_offload(in, c.stream_engine);
    for (int k = 2; k < window && !c.stream.device_fits; ++k) {  // the smallest window that fits
      in.engine.param_window = k;
      offload::EngineConfig e;
      const MemoryPlan smaller = plan_offload(in, e);
      if (smaller.device_fits) {
        c.stream.advice = "--param-window " + std::to_string(k) + " fits the device (" +
                          format_bytes(smaller.device_total) + "); or " + c.stream.advice;
        break;
      }
    }
    in.engine.param_window = 0;
  }
  if (!gpu) {
    c.reason = "the host backend runs the offload engine (resident mode is for a GPU)";
  } else if (in.engine.state_on_drive) {
    c.reason = "--state-dir keeps the optimizer state on a drive";
  } else if (in.optimizer_state != StateFormat::kF32) {
    c.reason =
        std::string(state_format_name(in.optimizer_state)) + " optimizer state lives on the host";
  } else if (in.engine.master != DType::kF32) {
    c.reason = "bf16 master weights live on the host";
  } else if (in.engine.dpu) {
    c.reason = "--dpu delays offload mode's CPU update";
  } else if (in.grad_accum_on == AccumPlacement::kHost) {
    c.reason = "--grad-accum-on host sums offload mode's gradients on the host";
  } else if (!c.resident.device_fits) {
    c.reason = "the whole training state (" + format_bytes(c.resident.device_total) +
               ") does not fit on the device (" + format_bytes(in.device_capacity) + ")";
  } else {
    c.choose_resident = true;
    c.reason = "everything fits on the device, so nothing needs to cross PCIe";
  }
  if (!c.choose_resident && window > 0 && !c.offload.device_fits && c.stream.device_fits) {
    c.choose_stream = true;
    c.reason += "; every 16-bit parameter (offload mode, " + format_bytes(c.offload.device_total) +
                ") does not fit either, a window of " + std::to_string(window) + " blocks does";
  }
  return c;
}

std::string MemoryPlan::format(const PlanInput& in) const {
  std::ostringstream os;
  auto line = [&](const PlanLine& l) {
    os << "    " << l.what << std::string(l.what.size() < 40 ? 40 - l.what.size() : 1, ' ')
       << format_bytes(l.bytes) << "\n";
  };
  os << "memory plan for " << in.spec.name << " (" << in.spec.num_parameters() << " parameters, "
     << mode_name(in) << " mode)\n";
  os << "  device:\n";
  for (const auto& l : device)
    line(l);
  // Totals and capacities in both units: --device-memory and --host-memory take either.
  auto both = [](std::size_t b) { return format_bytes(b) + " (" + format_bytes_si(b) + ")"; };
  os << "    total" << std::string(35, ' ') << both(device_total) << "  of "
     << (in.device_capacity ? both(in.device_capacity) : std::string("unlimited"))
     << (device_fits ? "  fits" : "  DOES NOT FIT") << "\n";
  os << "  host:\n";
  for (const auto& l : host)
    line(l);
  os << "    total" << std::string(35, ' ') << both(host_total) << "  of "
     << (in.host_available ? both(in.host_available) + " available" : std::string("unknown"))
     << (host_fits ? "  fits" : "  DOES NOT FIT") << "\n";
  if (!in.resident && !accumulation.empty())
    os << "  gradient accumulation: " << accumulation << "\n";
  if (!streaming.empty()) os << "  parameter window: " << streaming << "\n";
  if (!drive.empty()) {
    os << "  drive (--state-dir):\n";
    for (const auto& l : drive)
      line(l);
    os << "    " << drive_traffic << "\n";
  }
  if (!advice.empty()) os << "  advice: " << advice << "\n";
  return os.str();
}

nlohmann::json MemoryPlan::to_json(const PlanInput& in) const {
  const auto side = [](const std::vector<PlanLine>& lines, std::size_t total, std::size_t capacity,
                       bool fits) {
    nlohmann::json terms = nlohmann::json::array();
    for (const PlanLine& l : lines)
      terms.push_back({{"what", l.what}, {"bytes", l.bytes}});
    return nlohmann::json{
        {"terms", terms}, {"total", total}, {"capacity", capacity}, {"fits", fits}};
  };
  nlohmann::json j = {{"model", in.spec.name},
                      {"parameters", in.spec.num_parameters()},
                      {"mode", mode_name(in)},
                      {"device", side(device, device_total, in.device_capacity, device_fits)},
                      {"host", side(host, host_total, in.host_available, host_fits)}};
  if (!in.resident && !accumulation.empty()) j["gradient_accumulation"] = accumulation;
  if (!streaming.empty()) j["parameter_window"] = streaming;
  if (!drive.empty()) {
    j["drive"] = side(drive, drive_total, 0, true);
    j["drive"]["traffic"] = drive_traffic;
  }
  if (!advice.empty()) j["advice"] = advice;
  return j;
}

std::size_t HostCost::largest_parameters(std::size_t budget) const {
  if (budget <= fixed_bytes) return 0;
  return static_cast<std::size_t>(double(budget - fixed_bytes) / bytes_per_parameter);
}

std::vector<HostCost> host_costs(const PlanInput& in) {
  std::vector<HostCost> out;
  const double n = double(in.spec.num_parameters());
  for (const DType master : {DType::kF32, DType::kBF16}) {
    for (const StateFormat state : {StateFormat::kF32, StateFormat::kBF16, StateFormat::kQ8}) {
      PlanInput c = in;
      c.resident = false;
      c.engine.master = master;
      c.optimizer_state = state;
      const MemoryPlan p = plan_memory(c);
      std::size_t grows = 0, fixed = 0;
      for (const PlanLine& l : p.host)
        (l.grows ? grows : fixed) += l.bytes;
      out.push_back({master, state, double(grows) / n, fixed});
    }
  }
  return out;
}

std::size_t largest_on_device(const PlanInput& in, const MemoryPlan& offload) {
  if (in.device_capacity == 0) return 0;
  std::size_t others = 0;
  for (const PlanLine& l : offload.device)
    if (!l.what.starts_with("parameters")) others += l.bytes;
  if (others >= in.device_capacity) return 0;
  return (in.device_capacity - others) / dtype_size(in.act_dtype);
}

namespace {

// "1.23 billion", "456.7 million": parameter counts as people say them.
std::string format_count(std::size_t n) {
  char buf[32];
  if (n >= 1'000'000'000) {
    std::snprintf(buf, sizeof buf, "%.2f billion", double(n) / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f million", double(n) / 1e6);
  }
  return buf;
}

}  // namespace

std::string format_host_costs(const std::vector<HostCost>& costs, std::size_t budget,
                              const std::string& budget_name) {
  std::ostringstream os;
  os << "  host bytes per parameter (offload), and the parameters each admits in " << budget_name
     << ":\n";
  for (const HostCost& c : costs) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "    --master-weights %-4s --optimizer-state %-4s %6.2f bytes  up to %s\n",
                  std::string(dtype_name(c.master)).c_str(),
                  std::string(state_format_name(c.state)).c_str(), c.bytes_per_parameter,
                  format_count(c.largest_parameters(budget)).c_str());
    os << line;
  }
  return os.str();
}

nlohmann::json host_costs_json(const std::vector<HostCost>& costs, std::size_t budget) {
  nlohmann::json rows = nlohmann::json::array();
  for (const HostCost& c : costs) {
    rows.push_back({{"master_weights", dtype_name(c.master)},
                    {"optimizer_state", state_format_name(c.state)},
                    {"bytes_per_parameter", c.bytes_per_parameter},
                    {"fixed_bytes", c.fixed_bytes},
                    {"largest_parameters", c.largest_parameters(budget)}});
  }
  return {{"budget", budget}, {"combinations", rows}};
}

}  // namespace zo::train
