// Checkpoint coordination over MPI (coordinator.h). Point-to-point messages
// on MPI_COMM_WORLD with tags of stoker's own, so they never match the job's
// receives or interleave with its collectives.
//
// A message is: u8 code (0 = ok), then the save's name and attempt as
// length-prefixed strings, then the payload (an encoded part record, or an
// error message).
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ckpt/coordinator.h"

namespace stoker::ckpt {

namespace {

// "ST" in ASCII, +1: far from the small tags jobs use.
constexpr int kTagPart = 0x5354;
constexpr int kTagOutcome = 0x5355;

void PutString(std::string* out, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  out->append(reinterpret_cast<const char*>(&n), sizeof n);
  out->append(s);
}

bool GetString(const std::string& in, size_t* at, std::string* s) {
  uint32_t n;
  if (in.size() < *at + sizeof n) return false;
  std::memcpy(&n, in.data() + *at, sizeof n);
  *at += sizeof n;
  if (in.size() < *at + n) return false;
  s->assign(in, *at, n);
  *at += n;
  return true;
}

std::string Encode(const MpiSaveId& id, const Status& st, const std::string& payload) {
  std::string m(1, static_cast<char>(st.code()));
  PutString(&m, id.name);
  PutString(&m, id.attempt);
  m += st.ok() ? payload : st.message();
  return m;
}

// Decodes a message; false when it is malformed or of another save.
bool Decode(const MpiSaveId& id, const std::string& m, Status* st, std::string* payload) {
  size_t at = 1;
  std::string name, attempt;
  if (m.empty() || !GetString(m, &at, &name) || !GetString(m, &at, &attempt)) return false;
  if (name != id.name || attempt != id.attempt) return false;
  const auto code = static_cast<Code>(static_cast<uint8_t>(m[0]));
  *payload = m.substr(at);
  *st = code == Code::kOk ? Status::Ok() : Status(code, *payload);
  return true;
}

Status MpiError(int rc, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  return IoError(std::string(call) + ": " + std::string(text, n));
}

Status Send(int to, int tag, const std::string& m) {
  int rc = MPI_Send(m.data(), static_cast<int>(m.size()), MPI_BYTE, to, tag, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(rc, "MPI_Send");
}

// Receives one message with `tag` from any rank, polling until `deadline`
// (MPI_Recv cannot time out). Sets *from to the sender, or returns TimedOut.
Status Receive(int tag, Deadline deadline, int* from, std::string* m) {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Iprobe(MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &flag, &status);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Iprobe");
    if (flag) {
      int n = 0;
      MPI_Get_count(&status, MPI_BYTE, &n);
      m->resize(n);
      rc = MPI_Recv(m->data(), n, MPI_BYTE, status.MPI_SOURCE, tag, MPI_COMM_WORLD,
                    MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Recv");
      *from = status.MPI_SOURCE;
      return Status::Ok();
    }
    if (Clock::now() >= deadline) return TimedOut("no message");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

bool MpiUsable(uint32_t rank, uint32_t world_size, bool background, std::string* why) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    *why = "MPI is not initialised in this process";
    return false;
  }
  int r = 0, n = 0, level = 0, is_main = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (static_cast<uint32_t>(r) != rank || static_cast<uint32_t>(n) != world_size) {
    *why = "MPI_COMM_WORLD is rank " + std::to_string(r) + " of " + std::to_string(n) +
           ", the save rank " + std::to_string(rank) + " of " + std::to_string(world_size);
    return false;
  }
  MPI_Query_thread(&level);
  MPI_Is_thread_main(&is_main);
  if (background && level < MPI_THREAD_MULTIPLE) {
    *why = "an asynchronous save needs MPI_THREAD_MULTIPLE (MPI_Init_thread)";
    return false;
  }
  if (!background && level < MPI_THREAD_SERIALIZED && !is_main) {
    *why = "MPI allows only its main thread to call it (MPI_THREAD_FUNNELED or less)";
    return false;
  }
  return true;
}

Status MpiSendPart(const MpiSaveId& id, const Status& outcome, const std::string& part) {
  return Send(0, kTagPart, Encode(id, outcome, part));
}

Status MpiGatherParts(const MpiSaveId& id, uint32_t world_size, Deadline deadline,
                      std::vector<std::string>* parts) {
  parts->resize(world_size);
  std::vector<bool> have(world_size, false);
  uint32_t missing = world_size - 1;
  Status first_failure;
  while (missing > 0) {
    int from = -1;
    std::string m;
    Status st = Receive(kTagPart, deadline, &from, &m);
    if (st.code() == Code::kTimedOut) {
      std::string who;
      for (uint32_t r = 1; r < world_size; ++r) {
        if (!have[r]) who += (who.empty() ? "" : ", ") + std::to_string(r);
      }
      return TimedOut("rank(s) " + who + " sent no outcome over MPI in time");
    }
    STOKER_RETURN_IF_ERROR(st);
    Status outcome;
    std::string payload;
    if (from <= 0 || static_cast<uint32_t>(from) >= world_size || have[from] ||
        !Decode(id, m, &outcome, &payload)) {
      continue;  // another save's late message
    }
    have[from] = true;
    --missing;
    if (!outcome.ok() && first_failure.ok()) {
      first_failure = outcome.WithContext("rank " + std::to_string(from) + " failed");
    }
    (*parts)[from] = std::move(payload);
  }
  return first_failure;
}

Status MpiSendOutcome(const MpiSaveId& id, uint32_t world_size, const Status& outcome) {
  const std::string m = Encode(id, outcome, "");
  for (uint32_t r = 1; r < world_size; ++r) {
    STOKER_RETURN_IF_ERROR(Send(static_cast<int>(r), kTagOutcome, m));
  }
  return Status::Ok();
}

Status MpiReceiveOutcome(const MpiSaveId& id, Deadline deadline) {
  for (;;) {
    int from = -1;
    std::string m;
    Status st = Receive(kTagOutcome, deadline, &from, &m);
    if (st.code() == Code::kTimedOut)
      return TimedOut("rank 0 sent no commit outcome over MPI in time");
    STOKER_RETURN_IF_ERROR(st);
    Status outcome;
    std::string payload;
    if (from == 0 && Decode(id, m, &outcome, &payload)) return outcome;
  }
}

}  // namespace stoker::ckpt
