#include "core/mapped_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <mutex>

namespace stoker {
namespace {

struct Frame {
  sigjmp_buf env;
  const std::byte* begin = nullptr;
  const std::byte* end = nullptr;
  volatile sig_atomic_t armed = 0;
};

thread_local Frame t_frame;
// Set while this thread runs the handler we forward to: a handler that
// re-raises into ours (Python's faulthandler does) ends in the default action.
thread_local volatile sig_atomic_t t_forwarding = 0;

std::mutex install_mu;  // serializes installs
// What was installed before ours. Read by the handler on any thread, so
// published whole through an atomic pointer; each install makes a new one
// and never frees the old (a handler may be reading it): a few hundred
// bytes per application handler noticed, which happens rarely.
std::atomic<const struct sigaction*> previous{nullptr};
static_assert(std::atomic<const struct sigaction*>::is_always_lock_free,
              "the SIGBUS handler reads it: it must be lock-free");
std::atomic<bool> installed{false};

void OnSigbus(int sig, siginfo_t* info, void* context) {
  Frame& f = t_frame;
  const auto* at = static_cast<const std::byte*>(info->si_addr);
  if (f.armed && at >= f.begin && at < f.end) {
    f.armed = 0;
    siglongjmp(f.env, 1);
  }
  // Not ours: to the handler that was there before. Once: one that
  // re-raises into ours (Python's faulthandler does) ends in the default.
  const struct sigaction* before = previous.load(std::memory_order_acquire);
  const bool siginfo = before != nullptr && (before->sa_flags & SA_SIGINFO);
  const bool handler = before != nullptr &&
                       (siginfo ? before->sa_sigaction != nullptr
                                : before->sa_handler != SIG_DFL && before->sa_handler != SIG_IGN);
  if (handler && !t_forwarding) {
    t_forwarding = 1;
    if (siginfo) {
      before->sa_sigaction(sig, info, context);
    } else {
      before->sa_handler(sig);
    }
    t_forwarding = 0;
    return;  // it dealt with the fault, or the load faults again
  }
  // The default action: restore it, and the faulting load runs again and
  // takes the process down as it would have without us.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
}

}  // namespace

void EnsureMappedGuard() {
  std::lock_guard lock(install_mu);
  struct sigaction now = {};
  sigaction(SIGBUS, nullptr, &now);
  if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == OnSigbus) return;
  struct sigaction ours = {};
  ours.sa_sigaction = OnSigbus;
  // SA_NODEFER: siglongjmp leaves the handler without restoring the signal
  // mask (sigsetjmp(env, 0) does not save it, which keeps the guard cheap),
  // so SIGBUS must not be blocked while it runs.
  ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  // Set `previous` before ours is live: a SIGBUS right after finds it.
  previous.store(new struct sigaction(now), std::memory_order_release);
  sigaction(SIGBUS, &ours, nullptr);
  installed = true;
}

namespace mapped_guard_internal {

bool Run(const std::byte* begin, size_t length, void (*call)(void*), void* fn) {
  if (!installed.load(std::memory_order_acquire)) EnsureMappedGuard();
  Frame& f = t_frame;
  if (sigsetjmp(f.env, 0) != 0) {
    // Left the handler by siglongjmp, which restores no signal mask. SA_NODEFER
    // kept SIGBUS unblocked, unless whoever ran our handler blocked it (a
    // sanitizer runs handlers from its own, with every signal blocked): a
    // blocked SIGBUS would kill at the next fault, so unblock it. The error
    // path only: one system call per fault.
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
    return false;
  }
  f.begin = begin;
  f.end = begin + length;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  f.armed = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  call(fn);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  f.armed = 0;
  return true;
}

}  // namespace mapped_guard_internal
}  // namespace stoker
