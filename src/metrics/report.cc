// stoker report: a run log (StepTimeline's JSON lines) into one HTML page
// with inline SVG plots; no script, no network, so it opens anywhere.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "stoker/metrics.h"

namespace stoker::metrics {
namespace {

struct Series {
  std::string name, color;
  std::vector<double> y;
};

constexpr const char* kColors[] = {"#d62728", "#9467bd", "#1f77b4",
                                   "#ff7f0e", "#2ca02c", "#7f7f7f"};

std::string Fmt(double v, int digits = 3) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", digits, v);
  return b;
}

std::string Escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else
      o += c;
  }
  return o;
}

// At most `n` points: means of consecutive groups, so a long run's plot stays
// a few kilobytes.
std::vector<double> Bin(const std::vector<double>& v, size_t n) {
  if (v.size() <= n) return v;
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t a = i * v.size() / n, b = (i + 1) * v.size() / n;
    double s = 0;
    for (size_t j = a; j < b; ++j) s += v[j];
    out[i] = s / double(b - a);
  }
  return out;
}

// A line plot (or, stacked, areas) of `series` against the step number.
std::string Plot(const std::string& id, const std::string& title, const std::string& unit,
                 std::vector<Series> series, uint64_t steps, bool stacked, double ymax_fixed = 0) {
  const double W = 760, H = 240, L = 60, R = 150, T = 28, B = 32;
  const size_t kPoints = 400;
  for (auto& s : series) s.y = Bin(s.y, kPoints);
  const size_t n = series.empty() ? 0 : series[0].y.size();
  std::vector<std::vector<double>> top(series.size(), std::vector<double>(n, 0));
  double ymax = 0;
  for (size_t i = 0; i < n; ++i) {
    double acc = 0;
    for (size_t k = 0; k < series.size(); ++k) {
      acc = stacked ? acc + series[k].y[i] : series[k].y[i];
      top[k][i] = acc;
      ymax = std::max(ymax, acc);
    }
  }
  if (ymax_fixed > 0) ymax = ymax_fixed;
  if (ymax <= 0) ymax = 1;
  auto X = [&](size_t i) { return L + (n <= 1 ? 0 : (W - L - R) * double(i) / double(n - 1)); };
  auto Y = [&](double v) { return T + (H - T - B) * (1 - v / ymax); };
  std::ostringstream o;
  o << "<svg class=\"plot\" id=\"" << id << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
    << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\">\n";
  o << "<text x=\"" << L << "\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" << Escape(title)
    << "</text>\n";
  o << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
    << "\" stroke=\"#333\"/><line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\""
    << H - B << "\" stroke=\"#333\"/>\n";
  for (int g = 0; g <= 4; ++g) {
    const double v = ymax * g / 4;
    o << "<text x=\"" << L - 4 << "\" y=\"" << Y(v) + 4
      << "\" font-size=\"10\" text-anchor=\"end\">" << Fmt(v, 4) << "</text>";
    o << "<line x1=\"" << L << "\" y1=\"" << Y(v) << "\" x2=\"" << W - R << "\" y2=\"" << Y(v)
      << "\" stroke=\"#eee\"/>\n";
  }
  o << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6
    << "\" font-size=\"11\" text-anchor=\"middle\">step (1.." << steps << ")</text>";
  o << "<text x=\"12\" y=\"" << (T + H - B) / 2 << "\" font-size=\"11\" transform=\"rotate(-90 12 "
    << (T + H - B) / 2 << ")\" text-anchor=\"middle\">" << Escape(unit) << "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    std::ostringstream pts;
    for (size_t i = 0; i < n; ++i) pts << Fmt(X(i), 6) << "," << Fmt(Y(top[k][i]), 6) << " ";
    if (stacked) {
      std::ostringstream base;
      for (size_t i = n; i-- > 0;) {
        base << Fmt(X(i), 6) << "," << Fmt(Y(k == 0 ? 0 : top[k - 1][i]), 6) << " ";
      }
      o << "<polygon class=\"series\" points=\"" << pts.str() << base.str() << "\" fill=\""
        << series[k].color << "\" fill-opacity=\"0.85\" stroke=\"none\"/>\n";
    } else {
      o << "<polyline class=\"series\" points=\"" << pts.str() << "\" fill=\"none\" stroke=\""
        << series[k].color << "\" stroke-width=\"1.5\"/>\n";
    }
    o << "<rect x=\"" << W - R + 10 << "\" y=\"" << T + 16 * k << "\" width=\"10\" height=\"10\" "
      << "fill=\"" << series[k].color << "\"/><text x=\"" << W - R + 24 << "\" y=\""
      << T + 9 + 16 * k << "\" font-size=\"11\">" << Escape(series[k].name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace

Status WriteReport(const std::string& run_log, const std::string& html_path) {
  std::ifstream in(run_log);
  if (!in) return ErrnoToStatus(errno, "open run log " + run_log);
  static constexpr const char* kNames[] = {"data", "h2d", "compute", "comm", "checkpoint", "other"};
  std::vector<std::vector<double>> phase(6);
  std::vector<double> seconds, throughput, wait_share, gpu, stall;
  double samples = 0;
  bool has_gpu = false;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
      const double s = j.at("seconds").get<double>();
      if (!(s >= 0)) throw std::runtime_error("negative seconds");
      seconds.push_back(s);
      for (int p = 0; p < 6; ++p) phase[p].push_back(j.value(kNames[p], 0.0));
      const double smp = j.value("samples", 0.0);
      samples += smp;
      throughput.push_back(s > 0 ? smp / s : 0);
      wait_share.push_back(s > 0 ? 100 * j.value("data", 0.0) / s : 0);
      stall.push_back(j.value("checkpoint", 0.0));
      const double g = j.value("gpu_utilization", -1.0);
      has_gpu |= g >= 0;
      gpu.push_back(std::max(0.0, g) * 100);
    } catch (const std::exception& e) {
      return InvalidArgument(run_log + ":" + std::to_string(n) + ": not a step record (" +
                             e.what() + ")");
    }
  }
  if (seconds.empty()) return InvalidArgument(run_log + ": no steps");
  const uint64_t steps = seconds.size();
  double total = 0;
  for (double s : seconds) total += s;

  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>stoker report: "
    << Escape(run_log) << "</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222}"
    << "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 10px;"
    << "text-align:right}th:first-child,td:first-child{text-align:left}svg{display:block;"
    << "margin:12px 0}</style></head><body>\n";
  h << "<h1>stoker report</h1>\n<p>" << Escape(run_log) << ": " << steps << " steps, "
    << Fmt(total, 4) << " s";
  if (samples > 0) h << ", " << Fmt(samples / total, 4) << " samples/s";
  h << "</p>\n<h2>Where a step's time goes</h2>\n<table id=\"summary\"><tr><th>phase</th>"
    << "<th>seconds</th><th>% of step</th><th>ms per step</th></tr>\n";
  for (int p = 0; p < 6; ++p) {
    double sum = 0;
    for (double v : phase[p]) sum += v;
    h << "<tr><td>" << kNames[p] << "</td><td>" << Fmt(sum, 4) << "</td><td>"
      << Fmt(100 * sum / total, 3) << "</td><td>" << Fmt(1000 * sum / double(steps), 3)
      << "</td></tr>\n";
  }
  h << "<tr><th>step</th><th>" << Fmt(total, 4) << "</th><th>100</th><th>"
    << Fmt(1000 * total / double(steps), 3) << "</th></tr></table>\n";

  std::vector<Series> stack;
  for (int p = 0; p < 6; ++p) {
    std::vector<double> ms(phase[p].size());
    for (size_t i = 0; i < ms.size(); ++i) ms[i] = 1000 * phase[p][i];
    stack.push_back({kNames[p], kColors[p], ms});
  }
  h << Plot("plot-breakdown", "Step time by phase (stacked)", "ms", stack, steps, true);
  h << Plot("plot-throughput", "Throughput", "samples/s", {{"samples/s", "#1f77b4", throughput}},
            steps, false);
  h << Plot("plot-data-wait", "Data-wait share of the step", "%",
            {{"data wait", "#d62728", wait_share}}, steps, false, 100);
  if (has_gpu) {
    h << Plot("plot-gpu", "GPU utilisation against data wait", "%",
              {{"GPU utilisation", "#2ca02c", gpu}, {"data wait", "#d62728", wait_share}}, steps,
              false, 100);
  }
  std::vector<double> stall_ms(stall.size());
  for (size_t i = 0; i < stall.size(); ++i) stall_ms[i] = 1000 * stall[i];
  h << Plot("plot-checkpoint", "Checkpoint stalls", "ms", {{"stall", "#2ca02c", stall_ms}}, steps,
            false);
  h << "<p>Phases are disjoint: an instant covered by several goes to the first of comm, "
       "checkpoint, h2d, data, compute; other is what no phase covered.</p>\n</body></html>\n";

  const std::string tmp = html_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return ErrnoToStatus(errno, "open " + tmp);
    out << h.str();
    if (!out.flush()) return ErrnoToStatus(errno, "write " + tmp);
  }
  if (std::rename(tmp.c_str(), html_path.c_str()) != 0) {
    return ErrnoToStatus(errno, "rename " + tmp + " to " + html_path);
  }
  return Status::Ok();
}

}  // namespace stoker::metrics
