#include "cli/cli_support.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "cli/commands.h"

namespace trainguard {

namespace fs = std::filesystem;

std::string SelfExe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "trainguard";
  buf[n] = '\0';
  return buf;
}

// Where the Python package sits next to the binary (build tree or install).
std::string PythonDir() {
  fs::path exe = SelfExe();
  for (const fs::path& candidate :
       {exe.parent_path() / "python", exe.parent_path().parent_path() / "lib" / "trainguard" / "python"}) {
    if (fs::exists(candidate / "trainguard" / "__init__.py")) return candidate.string();
  }
  return "";
}

// The shipped attribution rules: next to the binary (build tree) or installed.
std::string DefaultRulesPath() {
  fs::path exe = SelfExe();
  for (const fs::path& candidate : {exe.parent_path() / "rules" / "attribution.json",
                                    exe.parent_path().parent_path() / "share" / "trainguard" /
                                        "rules" / "attribution.json"}) {
    if (fs::exists(candidate)) return candidate.string();
  }
  return "";
}

std::string DefaultJobId() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "job-%Y%m%d-%H%M%S", std::gmtime(&t));
  return std::string(buf) + "-" + std::to_string(getpid());
}

std::string Hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string DefaultStorePath() {
  fs::path dir;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state != nullptr && *state == '/') {
    dir = fs::path(state) / "trainguard";
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    dir = fs::path(home) / ".local" / "state" / "trainguard";
  } else {
    dir = fs::path("/tmp") / ("trainguard-" + std::to_string(getuid()));
  }
  return (dir / "trainguard.db").string();
}

StatusOr<RuleSet> LoadRulesFor(const std::vector<std::string>& extra) {
  const char* env = std::getenv("TRAINGUARD_RULES");
  std::string path = env != nullptr && *env != '\0' ? env : DefaultRulesPath();
  if (path.empty()) return NotFound("the shipped rule file attribution.json was not found next to " + SelfExe());
  auto rules = RuleSet::Load(path);
  if (!rules.ok()) return rules.status();
  for (const auto& p : extra) {
    auto more = RuleSet::Load(p);
    if (!more.ok()) return more.status();
    rules->Merge(*more);
  }
  return rules;
}

}  // namespace trainguard
