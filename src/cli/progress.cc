// The commands' progress bar (cli.h).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cli/cli.h"

namespace stoker::cli {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ProgressBar::ProgressBar(bool enabled) : enabled_(enabled), start_(Now()) {}

double ProgressBar::Seconds() const { return Now() - start_; }

void ProgressBar::Update(uint64_t done, uint64_t total, const std::string& extra) {
  if (!enabled_) return;
  const double now = Now();
  if (last_ >= 0 && now - last_ < 0.1 && (total == 0 || done < total)) return;
  last_ = now;
  const double secs = now - start_;
  const double rate = secs > 0 ? done / secs : 0;
  constexpr int kWidth = 30;
  const double frac = total ? std::min(1.0, double(done) / total) : 0;
  const int filled = int(frac * kWidth);
  char eta[32] = "";
  if (total && rate > 0) {
    const long left = long((total > done ? total - done : 0) / rate + 0.5);
    std::snprintf(eta, sizeof eta, "  ETA %ld:%02ld", left / 60, left % 60);
  }
  std::fprintf(stderr, "\r[%.*s%*s] %5.1f%%  %.0f MB/s%s  %s ", filled,
               "##############################", kWidth - filled, "", frac * 100, rate / 1e6, eta,
               extra.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}

}  // namespace stoker::cli
