// The TCP bootstrap: every rank connects to rank 0, which relays. Enough for
// the few small messages of a benchmark (bootstrap.h), and it needs nothing
// but the address torchrun (or the user) exports.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"

namespace stoker::comm {

namespace {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Waits until `fd` is readable or writable, up to the deadline.
Status WaitFor(int fd, short events, Clock::time_point deadline, const std::string& peer) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return TimedOut("no message from " + peer + " in time");
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (rc > 0) return Status::Ok();
    if (rc < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll " + peer);
  }
}

Status SendAll(int fd, const void* data, size_t n, Clock::time_point deadline,
               const std::string& peer) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    STOKER_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, peer));
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0)
      return Unavailable("sending to " + peer + ": " + std::strerror(errno) + " (it died?)");
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    STOKER_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, peer));
    const ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k == 0) return Unavailable(peer + " closed its connection (it exited or died)");
    if (k < 0) return Unavailable("receiving from " + peer + ": " + std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::Ok();
}

Status SendString(int fd, const std::string& s, Clock::time_point deadline,
                  const std::string& peer) {
  const uint64_t len = s.size();
  STOKER_RETURN_IF_ERROR(SendAll(fd, &len, 8, deadline, peer));
  return SendAll(fd, s.data(), s.size(), deadline, peer);
}

Result<std::string> RecvString(int fd, Clock::time_point deadline, const std::string& peer) {
  uint64_t len = 0;
  STOKER_RETURN_IF_ERROR(RecvAll(fd, &len, 8, deadline, peer));
  if (len > (64u << 20))
    return Corruption(peer + " sent a " + std::to_string(len) + "-byte message");
  std::string s(len, '\0');
  STOKER_RETURN_IF_ERROR(RecvAll(fd, s.data(), len, deadline, peer));
  return s;
}

std::string RankName(int r) { return "rank " + std::to_string(r); }

class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(int rank, int size, std::string where, double timeout_s)
      : rank_(rank), size_(size), where_(std::move(where)), timeout_(timeout_s) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string description() const override { return "tcp " + where_; }

  Status Listen(uint16_t port) {
    Fd fd(socket(AF_INET6, SOCK_STREAM, 0));
    if (fd.get() < 0) return ErrnoToStatus(errno, "socket");
    int on = 1, off = 0;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(port);
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      return ErrnoToStatus(errno, "bind port " + std::to_string(port) +
                                      " for the comm bootstrap (set STOKER_COMM_PORT)");
    }
    if (listen(fd.get(), size_) != 0) return ErrnoToStatus(errno, "listen");
    peers_.resize(size_);
    const auto deadline = Clock::now() + Seconds();
    for (int joined = 1; joined < size_;) {
      Status st = WaitFor(fd.get(), POLLIN, deadline, "the other ranks");
      if (!st.ok()) {
        std::string missing;
        for (int r = 1; r < size_; ++r) {
          if (peers_[r].get() < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        return TimedOut("rank 0: ranks " + missing + " did not connect to " + where_ + " within " +
                        std::to_string(int(timeout_)) + " s");
      }
      Fd peer(accept(fd.get(), nullptr, nullptr));
      if (peer.get() < 0) continue;
      int32_t r = -1;
      if (!RecvAll(peer.get(), &r, 4, deadline, "a connecting rank").ok()) continue;
      if (r <= 0 || r >= size_ || peers_[r].get() >= 0) {
        return InvalidArgument("rank 0: a process connected as rank " + std::to_string(r) + " of " +
                               std::to_string(size_) +
                               ": two jobs share the address, or ranks disagree on the world size");
      }
      NoDelay(peer.get());
      peers_[r] = std::move(peer);
      ++joined;
    }
    return Status::Ok();
  }

  Status Connect(const std::string& host, uint16_t port) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) return InvalidArgument("MASTER_ADDR=" + host + ": " + gai_strerror(rc));
    const auto deadline = Clock::now() + Seconds();
    Status last;
    // Rank 0 may not listen yet: retry until the deadline.
    while (Clock::now() < deadline) {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        Fd fd(socket(a->ai_family, a->ai_socktype, a->ai_protocol));
        if (fd.get() >= 0 && connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
          freeaddrinfo(res);
          NoDelay(fd.get());
          const int32_t r = rank_;
          STOKER_RETURN_IF_ERROR(SendAll(fd.get(), &r, 4, deadline, "rank 0"));
          root_ = std::move(fd);
          return Status::Ok();
        }
        last = ErrnoToStatus(errno, "connect to rank 0 at " + where_);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    freeaddrinfo(res);
    return TimedOut(RankName(rank_) + ": rank 0 did not answer at " + where_ + " within " +
                    std::to_string(int(timeout_)) + " s (" + last.message() + ")");
  }

  Result<std::vector<std::string>> AllGather(const std::string& mine) override {
    const auto deadline = Clock::now() + Seconds();
    std::vector<std::string> all(size_);
    if (rank_ != 0) {
      STOKER_RETURN_IF_ERROR(SendString(root_.get(), mine, deadline, "rank 0"));
      for (int r = 0; r < size_; ++r) {
        STOKER_ASSIGN_OR_RETURN(all[r], RecvString(root_.get(), deadline, "rank 0"));
      }
      return all;
    }
    all[0] = mine;
    for (int r = 1; r < size_; ++r) {
      auto s = RecvString(peers_[r].get(), deadline, RankName(r));
      if (!s.ok()) return s.status().WithContext("rank 0");
      all[r] = std::move(*s);
    }
    for (int r = 1; r < size_; ++r) {
      for (const auto& s : all) {
        STOKER_RETURN_IF_ERROR(SendString(peers_[r].get(), s, deadline, RankName(r)));
      }
    }
    return all;
  }

 private:
  std::chrono::milliseconds Seconds() const {
    return std::chrono::milliseconds(static_cast<int64_t>(timeout_ * 1000));
  }
  static void NoDelay(int fd) {
    int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  }

  int rank_, size_;
  std::string where_;
  double timeout_;
  Fd root_;                // ranks > 0: the connection to rank 0
  std::vector<Fd> peers_;  // rank 0: by rank
};

Result<uint16_t> PortFrom(const char* name, const char* text, int add) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10) + add;
  if (*text == '\0' || *end != '\0' || v <= 0 || v > 65535) {
    return InvalidArgument(std::string(name) + "='" + text + "' is not a port");
  }
  return static_cast<uint16_t>(v);
}

}  // namespace

Result<std::unique_ptr<Bootstrap>> MakeTcpBootstrap(const RankInfo& info, double timeout_s) {
  const char* host = std::getenv("MASTER_ADDR");
  const char* port_env = std::getenv("STOKER_COMM_PORT");
  const char* master_port = std::getenv("MASTER_PORT");
  if (info.world_size > 1 && (host == nullptr || (port_env == nullptr && master_port == nullptr))) {
    return InvalidArgument(
        "the ranks meet over TCP here (" + info.ToString() +
        "), which needs MASTER_ADDR and MASTER_PORT (or STOKER_COMM_PORT) as torchrun sets them; "
        "export them, or launch with mpirun in a build with MPI");
  }
  uint16_t port = 0;
  if (port_env != nullptr) {
    STOKER_ASSIGN_OR_RETURN(port, PortFrom("STOKER_COMM_PORT", port_env, 0));
  } else if (master_port != nullptr) {
    // MASTER_PORT itself is torchrun's store.
    STOKER_ASSIGN_OR_RETURN(port, PortFrom("MASTER_PORT", master_port, 1));
  }
  const std::string where = std::string(host ? host : "localhost") + ":" + std::to_string(port);
  auto b = std::make_unique<TcpBootstrap>(info.rank, info.world_size, where, timeout_s);
  if (info.world_size > 1) {
    STOKER_RETURN_IF_ERROR(info.rank == 0 ? b->Listen(port) : b->Connect(host, port));
  }
  return std::unique_ptr<Bootstrap>(std::move(b));
}

Result<std::unique_ptr<Bootstrap>> MakeBootstrap(const RankInfo& info, double timeout_s) {
  if (!info.launched()) {
    return InvalidArgument(std::string("not started by a launcher (no rank in the environment): ") +
                           kLaunchHint);
  }
  if (info.launcher != "torchrun") {
    auto mpi = MakeMpiBootstrap(info);
    if (mpi.ok() || mpi.status().code() != Code::kUnsupported) return mpi;
  }
  return MakeTcpBootstrap(info, timeout_s);
}

}  // namespace stoker::comm
