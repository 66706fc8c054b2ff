#include "report/system_info.h"

#include <sstream>
#include <thread>

#include "comm/comm.h"
#include "cpu_adam/cpu_adam.h"
#include "device/make_device.h"
#include "pinned_memory/host_buffer.h"

namespace zo::report {

nlohmann::json system_info() {
  nlohmann::json j;
  nlohmann::json isas = nlohmann::json::array();
  for (auto isa : cpu_adam::supported_isas())
    isas.push_back(cpu_adam::isa_name(isa));
  j["cpu_adam"] = {{"supported_isas", isas},
                   {"selected_isa", cpu_adam::isa_name(cpu_adam::default_isa())},
                   {"chunk_elements", cpu_adam::kChunkElements}};
  j["host"] = {{"hardware_threads", std::thread::hardware_concurrency()},
               {"mem_available_bytes", pinned::host_available_bytes()},
               {"numa_nodes", pinned::numa_node_count()}};
  const dev::CudaInfo cuda = dev::cuda_info();
  nlohmann::json gpus = nlohmann::json::array();
  for (const dev::GpuInfo& d : cuda.gpus) {
    gpus.push_back(
        {{"index", d.index},
         {"name", d.name},
         {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
         {"total_bytes", d.total_bytes},
         {"free_bytes", d.free_bytes},
         {"sm_count", d.sm_count},
         {"usable", d.unusable_reason.empty()},
         {"unusable_reason", d.unusable_reason}});
  }
  j["cuda"] = {
      {"built", cuda.built}, {"devices", gpus}, {"no_device_reason", cuda.no_device_reason}};
  // Multi-process: whether MPI is built in and where this process sits (rank discovery errors
  // are reported here rather than thrown: `info` is for diagnosing exactly those).
  nlohmann::json ranks = {{"mpi_built", comm::mpi_available()}, {"nccl_built", cuda.nccl_built}};
  try {
    const comm::RankInfo r = comm::rank_info_from_env();
    ranks.update(
        {{"rank", r.rank}, {"size", r.size}, {"local_rank", r.local_rank}, {"source", r.source}});
  } catch (const std::exception& e) {
    ranks["error"] = e.what();
  }
  j["ranks"] = ranks;
  return j;
}

std::string format_system_info(const nlohmann::json& j) {
  std::ostringstream os;
  const auto gib = [](std::size_t b) { return double(b) / double(1ull << 30); };
  os << "CPU Adam      : " << j["cpu_adam"]["selected_isa"].get<std::string>() << " (supported:";
  for (const auto& isa : j["cpu_adam"]["supported_isas"])
    os << ' ' << isa.get<std::string>();
  os << "; force with ZO_CPU_ADAM_ISA)\n";
  os << "host threads  : " << j["host"]["hardware_threads"].get<unsigned>() << "\n";
  os.precision(1);
  os << std::fixed << "host memory   : " << gib(j["host"]["mem_available_bytes"].get<std::size_t>())
     << " GiB available\n";
  os << "NUMA nodes    : " << j["host"]["numa_nodes"].get<int>() << "\n";
  os << "CUDA backend  : " << (j["cuda"]["built"].get<bool>() ? "built" : "not built") << "\n";
  for (const auto& d : j["cuda"]["devices"]) {
    os << "  GPU " << d["index"].get<int>() << ": " << d["name"].get<std::string>() << ", sm "
       << d["compute_capability"].get<std::string>() << ", "
       << gib(d["free_bytes"].get<std::size_t>()) << " / "
       << gib(d["total_bytes"].get<std::size_t>()) << " GiB free, " << d["sm_count"].get<int>()
       << " SMs"
       << (d["usable"].get<bool>() ? ""
                                   : " (unusable: " + d["unusable_reason"].get<std::string>() + ")")
       << "\n";
  }
  const auto reason = j["cuda"]["no_device_reason"].get<std::string>();
  if (!reason.empty()) os << "  no GPU: " << reason << "\n";
  const auto& r = j["ranks"];
  os << "MPI           : " << (r["mpi_built"].get<bool>() ? "built" : "not built") << ", NCCL "
     << (r["nccl_built"].get<bool>() ? "built" : "not built") << "; ";
  if (r.contains("error")) {
    os << "bad rank environment: " << r["error"].get<std::string>() << "\n";
  } else {
    os << "rank " << r["rank"].get<int>() << " of " << r["size"].get<int>() << " (local rank "
       << r["local_rank"].get<int>() << ", " << r["source"].get<std::string>() << ")\n";
  }
  return os.str();
}

}  // namespace zo::report
