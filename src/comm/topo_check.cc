// `stoker topo --check` across a job: each rank judges its own binding
// against the node's topology, and the verdicts are gathered (topo.h).
#include <algorithm>
#include <cstdlib>

#include "comm/bootstrap.h"
#include "stoker/topo.h"

namespace stoker {

namespace comm {

namespace {

constexpr char kSep = '\x1f';

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == kSep) {
      f.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return f;
}

}  // namespace

std::string EncodeBinding(const RankBinding& b, const std::vector<std::string>& extra) {
  std::string rec = std::to_string(b.rank) + kSep + std::to_string(b.local_rank) + kSep + b.host +
                    kSep + b.cpus + kSep + std::to_string(b.numa) + kSep + b.gpu + kSep + b.nic;
  for (const auto& e : extra) rec += kSep + e;
  return rec;
}

RankBinding DecodeBinding(const std::string& s, std::vector<std::string>* extra) {
  auto f = Split(s);
  f.resize(std::max<size_t>(f.size(), 7));
  RankBinding b;
  b.rank = std::atoi(f[0].c_str());
  b.local_rank = std::atoi(f[1].c_str());
  b.host = f[2];
  b.cpus = f[3];
  b.numa = std::atoi(f[4].c_str());
  b.gpu = f[5];
  b.nic = f[6];
  if (extra != nullptr) extra->assign(f.begin() + 7, f.end());
  return b;
}

}  // namespace comm

Result<std::vector<RankBindingCheck>> CheckJobBinding(double timeout_s) {
  STOKER_ASSIGN_OR_RETURN(RankInfo me, DiscoverRank());
  if (!me.launched()) {
    return InvalidArgument(std::string("stoker topo --check judges each rank of a job: ") +
                           kLaunchHint);
  }
  STOKER_ASSIGN_OR_RETURN(auto boot, comm::MakeBootstrap(me, timeout_s));
  auto topo = LoadTopology();
  STOKER_RETURN_IF_ERROR(comm::AgreeOnStatus(*boot, topo.status()));
  const std::vector<int> cpus = AffinityCpus();
  const RankBinding b = CurrentBinding(&*topo, me, "");
  STOKER_ASSIGN_OR_RETURN(auto all,
                          boot->AllGather(comm::EncodeBinding(b, CheckBinding(*topo, b, cpus))));
  std::vector<RankBindingCheck> out;
  for (const auto& s : all) {
    RankBindingCheck c;
    c.binding = comm::DecodeBinding(s, &c.problems);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace stoker
