#include "checkpoint/json_input.h"

#include <set>
#include <string>
#include <vector>

namespace zo::ckpt {

nlohmann::json parse_json(std::string_view text) {
  using Event = nlohmann::json::parse_event_t;
  // The keys seen so far in each open object or array (arrays have none); the parser is
  // iterative, so only this bound keeps the value's depth within what recursion can handle.
  std::vector<std::set<std::string>> open;
  const auto check = [&open](int depth, Event event, nlohmann::json& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (depth >= kMaxJsonDepth) {
          throw JsonError("objects and arrays nest deeper than " + std::to_string(kMaxJsonDepth) +
                          " levels");
        }
        open.emplace_back();
        break;
      case Event::object_end:
      case Event::array_end:
        open.pop_back();
        break;
      case Event::key:
        if (!open.back().insert(parsed.get<std::string>()).second) {
          throw JsonError("key " + parsed.dump() +
                          " appears twice in one object; give each key once");
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::exception& e) {  // syntax errors, number overflow ("1e400")
    throw JsonError(e.what());
  }
}

}  // namespace zo::ckpt
