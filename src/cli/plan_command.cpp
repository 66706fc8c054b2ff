#include "plan_command.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/bytes.h"
#include "model/spec.h"
#include "pinned_memory/host_buffer.h"
#include "report/system_info.h"
#include "state_io/drive_probe.h"
#include "state_io/state_file.h"
#include "train/config.h"
#include "train/plan.h"

namespace zo::cli {

void add_plan_command(CLI::App& app, PlanCommand& cmd, const std::string& model_help) {
  auto* p = cmd.app = app.add_subcommand(
      "plan", "Print the memory plan for a model and batch, and whether it fits");
  p->add_option("--model", cmd.model, model_help)->capture_default_str();
  p->add_option("--micro-batch,-b", cmd.micro_batch, "sequences per micro-batch")
      ->capture_default_str();
  p->add_option("--seq-len", cmd.seq_len, "tokens per sequence; default block_size");
  p->add_flag("--recompute", cmd.recompute, "activation recompute");
  p->add_option("--precision", cmd.precision, "device dtype: fp32 (host backend), bf16, fp16")
      ->capture_default_str();
  p->add_option("--optimizer-state", cmd.optimizer_state, "fp32, bf16 or q8")
      ->capture_default_str();
  p->add_option("--master-weights", cmd.master_weights, "fp32, or bf16 rounded stochastically")
      ->capture_default_str();
  p->add_option("--mode", cmd.mode, "auto (every mode and the choice), resident, offload or stream")
      ->capture_default_str();
  p->add_option("--param-window", cmd.param_window, "stream: blocks on the device; 0 = default")
      ->capture_default_str();
  p->add_option("--link-rate", cmd.link_gb_per_s,
                "stream: host-to-device GB/s for the prediction (bench_copy measures it)")
      ->capture_default_str();
  p->add_option("--device-tflops", cmd.device_tflops,
                "stream: TFLOP/s the device achieves on the model, for the prediction")
      ->capture_default_str();
  p->add_option("--grad-accum", cmd.grad_accum, "micro-batches per step")->capture_default_str();
  p->add_option("--grad-accum-on", cmd.grad_accum_on,
                "offload: sum micro-batches on the device, the host, or auto (device if it fits)")
      ->capture_default_str();
  add_size_option(p, "--bucket-size", cmd.bucket, "offload gradient bucket (default 32MiB)");
  p->add_flag("--dpu", cmd.dpu, "offload with delayed parameter update");
  add_size_option(p, "--device-memory", cmd.device_memory, "device capacity, e.g. 80GiB");
  add_size_option(p, "--host-memory", cmd.host_memory,
                  "host memory, e.g. 256GiB (default: what is available here)");
  p->add_option("--drive-rate", cmd.drive_gb_per_s,
                "--state-dir: the drive's GB/s each way, for the time a step's state traffic "
                "takes (info --state-dir measures it); 0 = not predicted")
      ->capture_default_str();
  p->add_option("--state-dir", cmd.state_dir,
                "offload/stream: plan the optimizer state in a file there (a drive) instead of "
                "host memory");
  p->add_option("--state-chunk", cmd.state_chunk,
                "--state-dir: elements per chunk of the state file (whole q8 blocks of 2048)")
      ->capture_default_str();
  p->add_flag("--json", cmd.json, "print one JSON object: every term in bytes, per mode");
  p->add_option("--ranks", cmd.ranks,
                "data-parallel ranks: plan one rank's share (offload, 1/N of the optimizer)")
      ->capture_default_str();
}

int run_plan(const PlanCommand& cmd) {
  // The flags as `train` would take them, checked by the same code: what plan admits, train runs.
  train::TrainConfig c;
  c.model = cmd.model;
  c.micro_batch = cmd.micro_batch;
  c.seq_len = cmd.seq_len;
  c.recompute = cmd.recompute;
  c.precision = cmd.precision;
  c.optimizer_state = parse_state_format(cmd.optimizer_state);
  c.master_weights = train::parse_master_weights(cmd.master_weights);
  c.mode = cmd.mode;
  c.param_window = cmd.param_window;
  c.grad_accum = cmd.grad_accum;
  c.grad_accum_on = cmd.grad_accum_on;
  if (cmd.bucket.given()) c.bucket_size = cmd.bucket.bytes();
  c.dpu = cmd.dpu;
  c.state_dir = cmd.state_dir;
  c.state_chunk_elements = cmd.state_chunk;
  train::PlanInput pi;
  pi.spec = model::load_model_spec(c.model);
  c.validate(pi.spec);
  // What train checks of --state-dir before it makes the state file there.
  if (!c.state_dir.empty()) state_io::check_state_dir(c.state_dir);
  if (c.state_dir.empty() && cmd.app->count("--drive-rate") > 0) {
    throw std::invalid_argument(
        "--drive-rate is the rate of the --state-dir drive, for the time its state traffic "
        "takes; add --state-dir DIR or drop --drive-rate");
  }
  if (c.precision == "auto")
    throw std::invalid_argument("plan --precision: give fp32, bf16 or fp16");
  if (cmd.ranks < 1) throw std::invalid_argument("--ranks must be >= 1");
  std::string mode = c.mode;
  if (cmd.ranks > 1) {  // as train under mpirun: offload, rank 0's partition
    if (mode == "resident" || mode == "stream") {
      throw std::invalid_argument(
          "--ranks > 1 plans data-parallel training, which uses --mode offload (the optimizer "
          "state is partitioned)");
    }
    mode = "offload";
    pi.engine.ranks = cmd.ranks;
  }
  pi.shape = {c.micro_batch, c.seq_len ? c.seq_len : pi.spec.block_size, c.recompute};
  pi.act_dtype = parse_dtype(c.precision);
  pi.optimizer_state = c.optimizer_state;
  pi.device_capacity = cmd.device_memory.bytes();
  pi.host_available =
      cmd.host_memory.given() ? cmd.host_memory.bytes() : pinned::host_available_bytes();
  pi.engine.grad_accum = c.grad_accum;
  pi.grad_accum_on = train::parse_accum_placement(c.grad_accum_on);
  pi.engine.dpu = c.dpu;
  pi.engine.bucket_bytes = c.bucket_size;
  pi.engine.master = c.master_weights;
  pi.engine.state_on_drive = !c.state_dir.empty();
  pi.state_chunk_elements = c.state_chunk_elements;
  if (!(cmd.link_gb_per_s > 0.0 && cmd.link_gb_per_s < 1e6) ||
      !(cmd.device_tflops > 0.0 && cmd.device_tflops < 1e6)) {
    throw std::invalid_argument("--link-rate and --device-tflops must be positive and finite");
  }
  if (!(cmd.drive_gb_per_s >= 0.0 && cmd.drive_gb_per_s < 1e6)) {
    throw std::invalid_argument("--drive-rate must be a finite number of GB/s >= 0");
  }
  pi.drive_gb_per_s = cmd.drive_gb_per_s;
  pi.link_gb_per_s = cmd.link_gb_per_s;
  pi.device_tflops = cmd.device_tflops;
  // Stream mode where train would offer it.
  const int window = pi.engine.param_window =
      train::offered_param_window(pi.spec, mode, c.param_window, cmd.ranks, c.dpu, c.grad_accum_on);

  const bool gpu = pi.act_dtype != DType::kF32;
  const auto choice = train::choose_mode(pi, gpu);
  const std::string pick = choice.choose_resident ? "resident"
                           : choice.choose_stream ? "stream"
                                                  : "offload";
  bool fits = false;
  nlohmann::json j = nlohmann::json::object();
  for (const std::string m : {"resident", "offload", "stream"}) {
    // auto: the stream plan when it matters, i.e. offload mode does not fit the device.
    if (mode != "auto" ? mode != m : m == "stream" && (window == 0 || choice.offload.device_fits))
      continue;
    if (m == "resident" && pi.engine.state_on_drive) continue;  // the state is on the drive
    pi.resident = m == "resident";
    pi.engine.param_window = m == "stream" ? window : 0;
    const auto& p = m == "resident" ? choice.resident
                    : m == "stream" ? choice.stream
                                    : choice.offload;
    // The state file needs its bytes free on the drive, as train checks when it makes it.
    bool drive_fits = true;
    std::string drive_note;
    if (pi.engine.state_on_drive) {
      std::error_code ec;
      const std::filesystem::space_info space = std::filesystem::space(c.state_dir, ec);
      if (!ec && space.available < p.drive_total) {
        drive_fits = false;
        drive_note = "  drive: DOES NOT FIT: " + format_bytes(p.drive_total) + " needed, " +
                     format_bytes(space.available) + " free under --state-dir " + c.state_dir +
                     "\n";
      }
    }
    if (cmd.json) {
      j[m] = p.to_json(pi);
      if (pi.engine.state_on_drive) j[m]["drive"]["fits"] = drive_fits;
    } else {
      std::fputs((p.format(pi) + drive_note).c_str(), stdout);
    }
    if (mode != "auto" || pick == m) fits = p.device_fits && p.host_fits && drive_fits;
  }
  pi.engine.param_window = 0;
  // Offload mode's host bytes per parameter of every combination, and what each admits.
  if (mode != "resident") {
    pi.resident = false;
    // Where --grad-accum sums, as the plan of the mode run has it (stream mode: on the host).
    const bool stream = mode == "stream" || (mode == "auto" && pick == "stream");
    pi.engine = stream ? choice.stream_engine : choice.offload_engine;
    pi.engine.param_window = 0;
    const auto costs = train::host_costs(pi);
    const std::size_t device_limit = train::largest_on_device(pi, choice.offload);
    if (cmd.json) {
      j["host_costs"] = train::host_costs_json(costs, pi.host_available);
      if (device_limit) j["host_costs"]["largest_on_device"] = device_limit;
    } else {
      const std::string budget =
          format_bytes(pi.host_available) +
          (cmd.host_memory.given() ? " (--host-memory)" : " (available here)");
      std::fputs(train::format_host_costs(costs, pi.host_available, budget).c_str(), stdout);
      if (pi.engine.state_on_drive) {
        std::printf(
            "  (--state-dir: master, m and v are on the drive, so the format changes the drive's "
            "bytes, not the host's)\n");
      }
      if (device_limit) {
        std::printf(
            "  device: offload mode keeps every weight there (%s): up to %.2f billion "
            "parameters in %s with these activations\n",
            std::string(dtype_name(pi.act_dtype)).c_str(), double(device_limit) / 1e9,
            format_bytes(pi.device_capacity).c_str());
      }
    }
  }
  if (mode == "auto") {
    if (cmd.json) {
      j["recommended"] = {{"mode", pick}, {"reason", choice.reason}};
    } else {
      std::printf("recommended: --mode %s (%s)\n", pick.c_str(), choice.reason.c_str());
    }
  }
  if (cmd.json) std::printf("%s\n", j.dump(2).c_str());
  return fits ? 0 : 3;
}

int run_info(bool json, const std::string& state_dir) {
  nlohmann::json j = report::system_info();
  if (!state_dir.empty()) {
    const state_io::DriveRates r = state_io::measure_drive(state_dir, std::uint64_t{1} << 30);
    j["state_dir"] = {{"dir", state_dir},
                      {"read_gbps", r.read_gbps},
                      {"write_gbps", r.write_gbps},
                      {"queue", r.queue},
                      {"io", r.io}};
  }
  train::PlanInput pi;
  pi.spec = model::load_model_spec("llama3.1-8b");
  pi.shape = {1, 4096, false};
  pi.act_dtype = DType::kBF16;
  pi.host_available = pinned::host_available_bytes();
  const auto costs = train::host_costs(pi);
  if (json) {
    j["host_costs"] = train::host_costs_json(costs, pi.host_available);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fputs(report::format_system_info(j).c_str(), stdout);
    if (j.contains("state_dir")) {
      const auto& d = j["state_dir"];
      std::printf(
          "--state-dir %s: read %.2f GB/s, write %.2f GB/s (1 GiB, %s, %s); give plan "
          "--drive-rate %.1f\n",
          state_dir.c_str(), d["read_gbps"].get<double>(), d["write_gbps"].get<double>(),
          d["io"].get<std::string>().c_str(), d["queue"].get<std::string>().c_str(),
          std::min(d["read_gbps"].get<double>(), d["write_gbps"].get<double>()));
    }
    std::fputs(train::format_host_costs(costs, pi.host_available,
                                        format_bytes(pi.host_available) + " available")
                   .c_str(),
               stdout);
    std::printf("  (bf16 on a GPU; see `offload_train plan` for a given model and run)\n");
  }
  return 0;
}

}  // namespace zo::cli
