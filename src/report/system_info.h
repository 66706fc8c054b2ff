// What this machine offers the trainer: CPU Adam paths, threads, host memory, NUMA, GPUs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace zo::report {

nlohmann::json system_info();
std::string format_system_info(const nlohmann::json& info);

}  // namespace zo::report
