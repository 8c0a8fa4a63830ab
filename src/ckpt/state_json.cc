// The state structure document's JSON: tags and the exact parser.
#include "ckpt/state_json.h"

#include <utility>
#include <vector>

namespace stoker::state_json {
namespace {

// Parses JSON as nlohmann does, except that an integer too large for 64
// bits stays exact: a binary value holding its digits (JSON itself has no
// binary values, so nothing else becomes one).
class ExactSax {
 public:
  using string_t = std::string;
  bool null() { return Add(nullptr); }
  bool boolean(bool v) { return Add(v); }
  bool number_integer(int64_t v) { return Add(v); }
  bool number_unsigned(uint64_t v) { return Add(v); }
  bool number_float(double v, const std::string& text) {
    if (text.find_first_of(".eE") == std::string::npos) {
      return Add(Json::binary(std::vector<uint8_t>(text.begin(), text.end())));
    }
    return Add(v);
  }
  bool string(std::string& v) { return Add(std::move(v)); }
  bool binary(Json::binary_t&) { return false; }
  bool start_object(size_t) { return Open(Json::object()); }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(size_t) { return Open(Json::array()); }
  bool end_array() { return Close(); }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
  Json root;

 private:
  Json* Place(Json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    return &(top[key_] = std::move(v));
  }
  bool Add(Json v) {
    Place(std::move(v));
    return true;
  }
  bool Open(Json v) {
    stack_.push_back(Place(std::move(v)));
    return stack_.size() <= 256;  // a state node nests at most 3 JSON levels, 60 of them
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }
  std::vector<Json*> stack_;
  std::string key_;
};

}  // namespace

// A tag node: an object of one key (a tensor may add "requires_grad").
std::string TagOf(const Json& node) {
  if (!node.is_object() || node.empty()) return "";
  if (node.size() == 2 && node.contains("requires_grad")) {
    for (const char* t : kTensorTags) {
      if (node.contains(t)) return t;
    }
    return "";
  }
  return node.size() == 1 ? node.begin().key() : "";
}

Json ParseExact(const char* begin, const char* end) {
  ExactSax sax;
  if (!Json::sax_parse(begin, end, &sax)) return nullptr;
  return std::move(sax.root);
}

}  // namespace stoker::state_json
