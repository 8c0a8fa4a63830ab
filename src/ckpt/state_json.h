// The state structure document's JSON (internal; docs/checkpoint.md §8):
// what the structure reader (state.cc) and the state trees (state_tree.cc)
// share.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace stoker::state_json {

using Json = nlohmann::ordered_json;

// The document's identity (§8): the Python package wrote it first, hence
// the name; C++ writes the same.
inline constexpr std::string_view kStructureFormat = "stoker.python.state";
inline constexpr int kStructureVersion = 1;

inline constexpr const char* kTensorTags[] = {"tensor", "parameter", "ndarray"};

// A tag node's tag: an object of one key (a tensor may add
// "requires_grad"); "" for any other node.
std::string TagOf(const Json& node);

// JSON parsed with integers beyond 64 bits kept exact (a binary value
// holding the digits); discarded (null) when it is no JSON.
Json ParseExact(const char* begin, const char* end);

}  // namespace stoker::state_json
