// transformers' sharded-weights format on paper: shard file names, the shard plan, the index JSON.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>

#include "checkpoint/json_input.h"
#include "checkpoint/safetensors_set.h"

namespace zo::ckpt {

std::string shard_file_name(std::size_t k, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k, n);
  return buf;
}

bool is_shard_file_name(std::string_view name) {
  static const std::regex re("model-[0-9]+-of-[0-9]+\\.safetensors");
  return std::regex_match(name.begin(), name.end(), re);
}

namespace {

[[noreturn]] void bad_index(const std::string& origin, const std::string& what) {
  throw CheckpointError("weights index " + origin + ": " + what +
                        "; it should be the model.safetensors.index.json that was saved with "
                        "the shards ({\"metadata\": {...}, \"weight_map\": {tensor: file}})");
}

// A shard must sit beside its index: no directories, so no way out of it.
bool plain_file_name(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find_first_of(std::string("/\\\0", 3)) == f.npos;
}

}  // namespace

std::map<std::string, std::string> parse_weights_index(std::string_view text,
                                                       const std::string& origin) {
  nlohmann::json j;
  try {
    j = parse_json(text);
  } catch (const JsonError& e) {
    bad_index(origin, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) bad_index(origin, "not a JSON object");
  if (j.contains("metadata") && !j["metadata"].is_object()) {
    bad_index(origin, "\"metadata\" is not an object");
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
    bad_index(origin, "no \"weight_map\" object");
  }
  if (j["weight_map"].empty()) bad_index(origin, "\"weight_map\" lists no tensors");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      bad_index(origin,
                "the file of tensor '" + tensor + "' is " + file.dump() + ", not a file name");
    }
    const std::string f = file.get<std::string>();
    if (!plain_file_name(f)) {
      bad_index(origin, "tensor '" + tensor + "' is in '" + f +
                            "', which is not a plain file name beside the index (shards are read "
                            "only from the index's own directory)");
    }
    out.emplace(tensor, f);
  }
  return out;
}

std::string weights_index_json(std::uint64_t total_size,
                               const std::map<std::string, std::string>& weight_map) {
  const nlohmann::json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  return j.dump(2) + "\n";
}

std::vector<std::size_t> plan_shards(std::span<const std::uint64_t> bytes,
                                     std::uint64_t max_bytes) {
  std::vector<std::size_t> starts;
  std::uint64_t current = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    // A new shard where this tensor would overflow the current one; an oversized tensor fills a
    // shard alone (current then exceeds max_bytes, so the next tensor starts another).
    if (starts.empty() || current + bytes[i] > max_bytes || current > max_bytes) {
      starts.push_back(i);
      current = 0;
    }
    current += bytes[i];
  }
  return starts;
}

}  // namespace zo::ckpt
