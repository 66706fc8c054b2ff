// The memory plan: what a run will allocate on the device and on the host, checked against the
// capacities before anything is allocated (docs/offload.md, "Choices and defaults").
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model.h"
#include "model/spec.h"
#include "offload/engine.h"
#include "optim/state_pager.h"

namespace zo::train {

// Where offload mode sums the micro-batches of --grad-accum > 1 (--grad-accum-on): on the device
// (an fp32 buffer of this rank's shards; one bucket per step crosses PCIe), on the host (every
// micro-batch's buckets cross PCIe; fp32 sums in host memory), or auto: the device when the
// plan fits there with the buffer, else the host.
enum class AccumPlacement { kAuto, kDevice, kHost };
AccumPlacement parse_accum_placement(const std::string& s);  // auto, device or host

struct PlanInput {
  model::ModelSpec spec;
  model::ModelShape shape;
  DType act_dtype = DType::kF32;                    // device parameters / activations
  StateFormat optimizer_state = StateFormat::kF32;  // host m, v
  std::size_t device_capacity = 0;                  // 0 = unlimited / unknown
  std::size_t host_available = 0;                   // 0 = unknown
  bool resident = false;  // fp32 master, m, v on the device (AdamW there) instead of the host
  // Offload mode: buckets, accumulation, DPU; param_window > 0: stream mode (a window of blocks
  // on the device).
  offload::EngineConfig engine;
  // Offload, grad_accum > 1: where to sum (choose_mode resolves it into engine's setting).
  AccumPlacement grad_accum_on = AccumPlacement::kAuto;
  // Stream mode's prediction of the micro-batch that hides the block copies: the host-to-device
  // rate (bench_copy's pinned rate on the H100 of docs/performance.md) and the rate the device
  // runs the model's matmuls at (an achieved bf16 rate of that class of GPU, not its peak).
  double link_gb_per_s = 55.0, device_tflops = 400.0;
  // The optimizer state on a drive (engine.state_on_drive): its chunks and staging slots.
  std::size_t state_chunk_elements = optim::kDefaultChunkElements;
  std::size_t state_slots = optim::kDefaultStagingSlots;
  double drive_gb_per_s = 0.0;   // the drive's rate each way; 0 = no time predicted
  std::size_t trace_events = 0;  // train --trace: the most events its trace holds (0: none)
};

// The host bytes one trace event may take (report::Trace keeps them until the end: the event, its
// name and its arguments' text, and a pointer while it writes them; 110 measured on average).
inline constexpr std::size_t kTraceEventBytes = 256;
inline constexpr std::size_t kTraceMaxEvents = 1'000'000;  // train --trace's cap

struct PlanLine {
  std::string what;
  std::size_t bytes;
  bool grows = true;  // grows with the parameters (not a fixed buffer or the activations)
};

struct MemoryPlan {
  std::vector<PlanLine> device, host;
  std::size_t device_total = 0, host_total = 0;
  bool device_fits = true, host_fits = true;
  std::string advice;        // what to change when something does not fit
  std::string accumulation;  // offload, grad_accum > 1: where micro-batches are summed, and why
  std::string streaming;     // stream mode: the window, and the parameter bytes a step copies
  // The optimizer state on a drive: the file, and what a step reads and writes.
  std::vector<PlanLine> drive;
  std::size_t drive_total = 0;
  std::string drive_traffic;

  std::string format(const PlanInput& in) const;
  // The same as an object: every line and total in bytes, the capacities, fits, advice.
  nlohmann::json to_json(const PlanInput& in) const;
};

// Offload mode: the device holds 16-bit parameters, activations and a few gradient buckets; the
// host holds fp32 master, m, v and the engine's staging (offload::engine_footprint). Resident
// mode: the device holds parameters, a full gradient buffer, activations and fp32 master, m, v;
// the host keeps a staging copy of them for initialisation and checkpoints.
MemoryPlan plan_memory(const PlanInput& in);

// "resident", "offload" or "stream": the mode a plan's input describes.
const char* mode_name(const PlanInput& in);

// The modes, the one `--mode auto` picks, and why: resident when the whole training state fits
// on a GPU (and the optimizer state is fp32), else offload, else (when in.engine.param_window >
// 0 offers it) stream mode if offload does not fit the device but the window does. The offload
// plan is that of in.grad_accum_on resolved: `offload_engine` is in.engine with
// accumulate_on_device set (and param_window 0); the stream plan sums on the host.
struct ModeChoice {
  MemoryPlan resident, offload, stream;
  offload::EngineConfig offload_engine, stream_engine;
  bool choose_resident = false, choose_stream = false;
  std::string reason;
};
ModeChoice choose_mode(PlanInput in, bool gpu);
// Stream mode's default window: 3 slots (2 for a model of 2 blocks); needs n_layer >= 2.
int default_param_window(const model::ModelSpec& spec);
// The window a plan offers stream mode (PlanInput::engine.param_window): --param-window or the
// default, for --mode stream, and for --mode auto where stream mode can run (one rank, no DPU,
// micro-batches not summed on the device, two blocks or more); 0 where it is not offered.
int offered_param_window(const model::ModelSpec& spec, const std::string& mode, int param_window,
                         int ranks, bool dpu, const std::string& grad_accum_on);

// What the host holds per parameter with each combination of master weights (fp32, bf16) and
// optimizer state (fp32, bf16, q8), the other settings as in a plan's input (offload mode), and
// the largest model each admits: (budget - fixed terms) / bytes per parameter.
struct HostCost {
  DType master;
  StateFormat state;
  double bytes_per_parameter;  // the host terms that grow with the model, over its parameters
  std::size_t fixed_bytes;     // those that do not (checkpoint buffers, loss and token staging)
  std::size_t largest_parameters(std::size_t budget) const;
};
std::vector<HostCost> host_costs(const PlanInput& in);
// The parameters whose 16-bit copy fits on the device beside the plan's other device terms
// (offload mode keeps every 16-bit weight there); 0 when the device capacity is unknown.
std::size_t largest_on_device(const PlanInput& in, const MemoryPlan& offload);
// The table `plan` and `info` print: one line per combination, the budget named.
std::string format_host_costs(const std::vector<HostCost>& costs, std::size_t budget,
                              const std::string& budget_name);
nlohmann::json host_costs_json(const std::vector<HostCost>& costs, std::size_t budget);

}  // namespace zo::train
