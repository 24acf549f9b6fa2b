#include "store/step_timing_text.h"

#include <charconv>
#include <map>

namespace trainguard {
namespace {

std::string Clean(const std::string& name) {
  std::string s = name;
  for (char& c : s) {
    if (c == ',' || c == ';' || c == '=') c = '_';
  }
  return s;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t from = 0;
  for (;;) {
    std::size_t at = s.find(sep, from);
    out.push_back(s.substr(from, at == std::string::npos ? std::string::npos : at - from));
    if (at == std::string::npos) return out;
    from = at + 1;
  }
}

bool ParseInt(const std::string& s, std::int64_t* v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

bool IsOperation(int kind) {
  return kind == kIntervalCollective || kind == kIntervalSend || kind == kIntervalRecv;
}

std::string TotalsKey(const TimedInterval& i) {
  if (IsOperation(i.kind)) return "comm:" + i.name;
  if (i.kind == kIntervalDevice) return "gpu:" + i.name;
  if (i.kind == kIntervalCpu) return "cpu:" + i.name;
  return i.name;
}

PhaseTotals SumByKey(const std::vector<TimedInterval>& intervals) {
  PhaseTotals out;
  std::map<std::string, std::size_t> at;
  for (const TimedInterval& i : intervals) {
    std::string key = Clean(TotalsKey(i));
    auto [it, added] = at.emplace(key, out.size());
    if (added) out.emplace_back(key, 0);
    out[it->second].second += i.duration_us;
  }
  return out;
}

std::string EncodeIntervals(const std::vector<TimedInterval>& intervals) {
  std::string s;
  for (const TimedInterval& i : intervals) {
    if (!s.empty()) s += ';';
    s += Clean(i.name);
    s += ',' + std::to_string(i.kind) + ',' + std::to_string(i.start_us) + ',' + std::to_string(i.duration_us);
    if (IsOperation(i.kind)) {
      s += ',' + std::to_string(i.group_id) + ',' + std::to_string(i.seq) + ',' + std::to_string(i.peer) + ',' +
           std::to_string(i.numel);
    }
  }
  return s;
}

StatusOr<std::vector<TimedInterval>> DecodeIntervals(const std::string& text) {
  std::vector<TimedInterval> out;
  if (text.empty()) return out;
  for (const std::string& entry : Split(text, ';')) {
    std::vector<std::string> f = Split(entry, ',');
    if (f.size() != 4 && f.size() != 8) return InvalidArgument("bad timing interval \"" + entry + "\"");
    TimedInterval i;
    i.name = f[0];
    std::int64_t v[8] = {};
    for (std::size_t k = 1; k < f.size(); ++k) {
      if (!ParseInt(f[k], &v[k])) return InvalidArgument("bad number in timing interval \"" + entry + "\"");
    }
    i.kind = static_cast<int>(v[1]);
    i.start_us = v[2];
    i.duration_us = v[3];
    if (f.size() == 8) {
      i.group_id = static_cast<std::int32_t>(v[4]);
      i.seq = v[5];
      i.peer = static_cast<std::int32_t>(v[6]);
      i.numel = v[7];
    }
    out.push_back(std::move(i));
  }
  return out;
}

std::string EncodeTotals(const PhaseTotals& totals) {
  std::string s;
  for (const auto& [key, us] : totals) {
    if (!s.empty()) s += ';';
    s += Clean(key) + '=' + std::to_string(us);
  }
  return s;
}

StatusOr<PhaseTotals> DecodeTotals(const std::string& text) {
  PhaseTotals out;
  if (text.empty()) return out;
  for (const std::string& entry : Split(text, ';')) {
    std::size_t eq = entry.rfind('=');
    std::int64_t v = 0;
    if (eq == std::string::npos || !ParseInt(entry.substr(eq + 1), &v)) {
      return InvalidArgument("bad timing total \"" + entry + "\"");
    }
    out.emplace_back(entry.substr(0, eq), v);
  }
  return out;
}

}  // namespace trainguard
