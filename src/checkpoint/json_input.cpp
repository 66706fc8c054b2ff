#include "checkpoint/json_input.h"

#include <set>
#include <string>
#include <vector>

namespace zo::ckpt {
namespace {

using Json = nlohmann::json;

// A first pass over the events alone: nesting depth and repeated keys. (nlohmann's parse with a
// callback would do it in one pass, but its DOM builder scans the enclosing object after every
// nested one: a safetensors header of 200,000 tensors took minutes.)
class Checker final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (!keys_.back().insert(k).second) {
      throw JsonError("key " + Json(k).dump() + " appears twice in one object; give each key once");
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw JsonError(e.what());  // syntax errors, number overflow ("1e400")
  }

 private:
  // The keys seen so far in each open object or array (arrays have none).
  bool open() {
    if (keys_.size() >= std::size_t(kMaxJsonDepth)) {
      throw JsonError("objects and arrays nest deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels");
    }
    keys_.emplace_back();
    return true;
  }
  bool close() {
    keys_.pop_back();
    return true;
  }
  std::vector<std::set<std::string>> keys_;
};

}  // namespace

Json parse_json(std::string_view text) {
  Checker checker;
  Json::sax_parse(text, &checker);
  try {
    return Json::parse(text);  // iterative: the depth is bounded already
  } catch (const Json::exception& e) {
    throw JsonError(e.what());
  }
}

}  // namespace zo::ckpt
