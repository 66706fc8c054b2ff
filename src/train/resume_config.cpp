#include "train/resume_config.h"

#include <cstdio>
#include <functional>
#include <map>

#include "core/error.h"

namespace zo::train {
namespace {

using Setter = std::function<void(TrainConfig&, const nlohmann::json&)>;

template <class T>
Setter set(T TrainConfig::*field) {
  return [field](TrainConfig& c, const nlohmann::json& v) { c.*field = v.get<T>(); };
}
template <class T>
Setter set_lr(T LrSchedule::*field) {
  return [field](TrainConfig& c, const nlohmann::json& v) { c.lr.*field = v.get<T>(); };
}

// key -> how to assign it; the flag that gives it is flag_of(key).
const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"seed", set(&TrainConfig::seed)},
      {"data", set(&TrainConfig::data)},
      {"data_format", set(&TrainConfig::data_format)},
      {"val_data", set(&TrainConfig::val_data)},
      {"val_fraction", set(&TrainConfig::val_fraction)},
      {"micro_batch", set(&TrainConfig::micro_batch)},
      {"seq_len", set(&TrainConfig::seq_len)},
      {"grad_accum", set(&TrainConfig::grad_accum)},
      {"lr", set_lr(&LrSchedule::max_lr)},
      {"min_lr_fraction", set_lr(&LrSchedule::min_lr_fraction)},
      {"warmup", set_lr(&LrSchedule::warmup_steps)},
      {"lr_decay", [](TrainConfig& c,
                      const nlohmann::json& v) { c.lr.decay = parse_decay(v.get<std::string>()); }},
      {"lr_schedule_steps", set_lr(&LrSchedule::total_steps)},
      {"beta1", set(&TrainConfig::beta1)},
      {"beta2", set(&TrainConfig::beta2)},
      {"adam_eps", set(&TrainConfig::eps)},
      {"weight_decay", set(&TrainConfig::weight_decay)},
      {"decay_embeddings", set(&TrainConfig::decay_embeddings)},
      {"decay_biases_and_norms", set(&TrainConfig::decay_biases_and_norms)},
      {"grad_clip", set(&TrainConfig::grad_clip)},
      {"optimizer_state",
       [](TrainConfig& c, const nlohmann::json& v) {
         c.optimizer_state = parse_state_format(v.get<std::string>());
       }},
      {"master_weights",
       [](TrainConfig& c, const nlohmann::json& v) {
         c.master_weights = parse_master_weights(v.get<std::string>());
       }},
      {"loss_scale", set(&TrainConfig::loss_scale)},
      {"loss_scale_window", set(&TrainConfig::loss_scale_window)},
      {"loss_scale_backoff", set(&TrainConfig::loss_scale_backoff)},
      {"loss_scale_min", set(&TrainConfig::loss_scale_min)},
      {"loss_scale_max", set(&TrainConfig::loss_scale_max)},
      {"bucket_size", set(&TrainConfig::bucket_size)},
      {"dpu", set(&TrainConfig::dpu)},
      {"dpu_warmup", set(&TrainConfig::dpu_warmup)},
  };
  return table;
}

std::string shown(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {  // floats were stored from float: show what the user typed
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v.get<double>());
    return buf;
  }
  return v.dump();
}

}  // namespace

std::string flag_of(const std::string& key) {
  std::string f = "--" + key;
  for (char& ch : f)
    if (ch == '_') ch = '-';
  return f;
}

const std::vector<std::string>& restored_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& [key, setter] : setters())
      k.push_back(key);
    return k;
  }();
  return keys;
}

std::vector<std::string> restore_run_settings(TrainConfig& cfg, const nlohmann::json& saved) {
  if (!saved.is_object()) {
    throw CheckpointError(
        "trainer_state.json: \"config\" is not an object; the checkpoint is "
        "damaged or from another program");
  }
  nlohmann::json recorded = saved;
  if (!recorded.contains("lr_schedule_steps") && recorded.contains("steps")) {
    recorded["lr_schedule_steps"] = recorded["steps"];  // written before the key existed
  }
  const nlohmann::json now = cfg.to_json();
  std::vector<std::string> overridden;
  for (const auto& [key, assign] : setters()) {
    const auto it = recorded.find(key);
    if (it == recorded.end()) continue;  // an older checkpoint: keep cfg's value
    if (cfg.explicit_keys.count(key) != 0) {
      if (now.at(key) != *it) {
        overridden.push_back(flag_of(key) + " " + shown(now.at(key)) +
                             " (the checkpointed run used " + shown(*it) + ")");
      }
      continue;
    }
    try {
      assign(cfg, *it);
    } catch (const std::exception& e) {
      throw CheckpointError("trainer_state.json: config key \"" + key + "\" holds " + it->dump() +
                            " (" + e.what() +
                            "); the checkpoint is damaged or from another "
                            "program");
    }
  }
  return overridden;
}

}  // namespace zo::train
